"""Each rank of a distributed GPU solve opens a CUDA context on its own device only (the GPU
backend's set-up once opened one on device 0 in every rank: half a GB there a rank); and
:func:`adaptmg.distributed.comm.names_gpu`, which lets a caller select the device first.
Worker: device_context_cases.py."""
import os
import shutil

import pytest

from adaptmg.backend import CPU
from adaptmg.distributed.comm import names_gpu
from test_forest import worker_records
from test_mpi import needs_mpi

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "device_context_cases.py")


def test_names_gpu_asks_cuda_nothing():
    assert names_gpu("gpu") and names_gpu("CUDA")
    assert not (names_gpu("cpu") or names_gpu("auto") or names_gpu(CPU) or names_gpu(None))


@needs_mpi
@pytest.mark.gpu
def test_every_rank_holds_one_context(tmp_path):
    import cupy
    if cupy.cuda.runtime.getDeviceCount() < 2 or shutil.which("nvidia-smi") is None:
        pytest.skip("needs two GPUs and nvidia-smi")
    rec = worker_records(WORKER, 2, tmp_path)[("contexts", "gpu")]
    assert rec["per_rank"] == [1, 1], rec
