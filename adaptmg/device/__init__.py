"""Device kernels: every custom kernel of adaptmg's core with its NumPy twin.

* :mod:`.kernels` -- fused element-wise vector kernels (Jacobi / Chebyshev updates,
  ``axpby``), the dense coarse GEMV, the CSR row kernels (Jacobi sweep, residual,
  SpMV that may run under CUDA-graph capture) and the SpMV plans (:func:`make_spmv`).
* :mod:`.multicsr` -- several sparse matrices on one sparsity pattern (:class:`MultiCSR`:
  ELL/sub-warp products, residual, Chebyshev step, dense symmetric GEMV).
* :mod:`.cudagraph` -- record one call into a CUDA graph and replay it (with a check
  that the replay reproduces the eager call).
* :mod:`.pdl` -- programmatic dependent launch of the recorded CSR/CG kernels (Hopper+):
  a kernel's launch and its reads of set-up data overlap the previous kernel's tail.
* :mod:`.host_reads` -- the device -> host bytes of a block of code (every ``get``,
  ``int()``, ``tolist``, NumPy conversion and device-to-host memcpy, by call site;
  Python 3.12's sys.monitoring): what a GPU set-up still reads back.
* :mod:`.priority` -- a block of host-bound set-up on the high-priority stream beside
  queued device work; :mod:`.deferred` -- the validity reads of queued work (an
  assembly's det J check) done at the end of such a block instead of at once.

Kernels come from memoised factories with names in the ``adaptmg_`` namespace; on
the host the same algorithm runs in NumPy, so one test body checks both.
"""
