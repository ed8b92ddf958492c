"""Merging manifest kernels into one NVRTC program (adaptmg.device.kernel_groups).

Checked on the CPU: the grouping never puts entries together that could collide (equal
kernel names, other options or headers, sources a namespace would change), the merged
program keeps each entry's declarations and macros its own, and the cubin comparison
accepts exactly the differences the module layout makes (synthetic ELF images).  With a
real NVRTC (CuPy's on a GPU machine, or ``ADAPTMG_TEST_NVRTC=<libnvrtc.so>`` with
``ADAPTMG_TEST_CUPY_INCLUDE=<folder with cupy/_core/include>``) the merged kernels of the
shipped manifest's first units are compared with the kernels compiled alone."""
import os
import runpy
import struct

import pytest

from adaptmg.device import kernel_groups as kg
from adaptmg.device import kernel_manifest as km

HEAD = "#include <cupy/complex.cuh>\n#include <cupy/carray.cuh>\n"
OPTS = ["-I{CUPY}/_core/include", "--std=c++17"]


def ew(name, t="int", opts=OPTS, head=HEAD, extra=""):
    src = f'{head}\ntypedef {t} T;\n{extra}\nextern "C" __global__ void {name}(T* x) {{ x[0] = 1; }}\n'
    return {"source": src, "options": list(opts), "backend": "nvrtc", "extra_source": 0}


def test_groups_keep_colliding_entries_apart():
    entries = [ew("take", "int"), ew("copy"), ew("take", "long"),                      # 0-2
               ew("fill", opts=OPTS + ["-DFIRST_PASS=1"]),                            # 3 other options
               ew("scan", head=HEAD + "#include <cub/block/block_reduce.cuh>\n"),     # 4 other headers
               ew("raw", head=""),                                                     # 5 no header: alone
               dict(ew("ne"), name_expressions=["f<int>"]),                            # 6 alone
               ew("ns", extra="namespace cub { struct X {}; }"),                       # 7 alone
               ew("spec", extra="template <> struct Y<int> {};"),                      # 8 alone
               dict(ew("tmpl"), source=HEAD + "template <class T> __global__ void tmpl(T* x) {}"),  # 9 alone
               ew("take", "short"), ew("sum"), ew("fill2", opts=OPTS + ["-DFIRST_PASS=1"])]          # 10-12
    units = kg.groups(entries)
    assert sorted(i for u in units for i in u) == list(range(len(entries)))           # each entry once
    assert [u[0] for u in units] == sorted(u[0] for u in units)                      # priority order kept
    for u in units:
        names = [n for i in u for n in kg.kernel_names(entries[i]) or ["-"]]
        assert len(names) == len(set(names))                                         # no name twice
        assert len({(str(entries[i]["options"]), kg.includes(entries[i]["source"])) for i in u}) == 1
    assert units == [[0, 1, 11], [2], [3, 12], [4], [5], [6], [7], [8], [9], [10]]   # 3 takes
    assert kg.groups(entries, size=2)[:3] == [[0, 1], [2, 11], [3, 12]]
    assert all(len(u) == 1 for u in kg.groups(entries, size=1))
    with pytest.raises(ValueError, match="group size"):
        kg.groups(entries, size=0)


def test_kernel_names():
    assert kg.kernel_names(ew("k")) == ["k"]
    raw = {"source": HEAD + 'extern "C" __global__ void __launch_bounds__(9 * (3 + 1))\nkb(int* x) {}\n'
                            'extern "C"\n__global__ void kc(int* x) {}'}
    assert kg.kernel_names(raw) == ["kb", "kc"]
    assert kg.kernel_names(ew("k", extra="// for hipCUB: the hipcub namespace /* namespace */")) == ["k"]
    assert kg.kernel_names(dict(ew("k"), jitify=True)) is None
    assert kg.kernel_names({"source": HEAD + 'extern "C" { __global__ void k(int* x) {} }'}) is None


def test_merged_source_scopes_each_entry():
    a = HEAD + "#define BLOCK 256\ntypedef int T;\nextern \"C\" __global__ void ka(T* x) { x[0] = BLOCK; }\n"
    b = HEAD + "#include <cub/block/block_load.cuh>\n#define BLOCK 512\ntypedef double T;\n" \
               "extern \"C\" __global__ void kb(T* x) { x[0] = BLOCK; }\n"
    src = kg.merged_source([a, b])
    lines = src.splitlines()
    assert lines[:3] == ["#include <cupy/complex.cuh>", "#include <cupy/carray.cuh>",
                         "#include <cub/block/block_load.cuh>"]                      # headers once, first
    assert src.count("#include") == 3
    ia, ib = src.index("namespace adaptmg_merged_0 {"), src.index("namespace adaptmg_merged_1 {")
    assert ia < src.index("typedef int T;") < src.index("}  // adaptmg_merged_0") < ib < src.index("typedef double T;")
    for k in (0, 1):                       # each entry's macro saved before it, restored after
        assert src.count('#pragma push_macro("BLOCK")') == 2 and src.count('#pragma pop_macro("BLOCK")') == 2
    assert src.index('#pragma pop_macro("BLOCK")') < ib


def _elf(sections, symbols):
    """A minimal ELF64 image: ``sections`` {name: bytes} plus .symtab/.strtab/.shstrtab."""
    strtab = b"\0" + b"".join(s.encode() + b"\0" for s in symbols)
    offs, k = [], 1
    for s in symbols:
        offs.append(k)
        k += len(s) + 1
    symtab = b"".join(struct.pack("<IBBHQQ", o, 0, 0, 0, 0, 0) for o in offs)
    secs = dict(sections, **{".symtab": symtab, ".strtab": strtab})
    names = [""] + list(secs) + [".shstrtab"]
    shstr = b"\0" + b"".join(n.encode() + b"\0" for n in names[1:])
    body, heads, pos = b"", [], 64
    for n in names[1:-1]:
        heads.append((shstr.index(b"\0" + n.encode() + b"\0") + 1, 1, pos, len(secs[n])))
        body += secs[n]
        pos += len(secs[n])
    heads.append((shstr.index(b"\0.shstrtab\0") + 1, 3, pos, len(shstr)))
    body += shstr
    pos += len(shstr)
    head = bytearray(64)
    struct.pack_into("<Q", head, 0x28, pos)
    struct.pack_into("<HHH", head, 0x3A, 64, len(names), len(names) - 1)
    table = bytes(64) + b"".join(struct.pack("<IIQQQQIIQQ", n, t, 0, 0, o, s, 0, 0, 0, 0) for n, t, o, s in heads)
    return bytes(head) + body + table


def _kernel(slot, sym_of_slot, cbank_sym, opcode=0x7B, rel_sym=2):
    """A one-kernel cubin: instruction 1 reads constant-bank-4 slot ``slot`` (in words)."""
    symbols = ["pad", ".nv.constant0.k", "tbl", "other"]
    text = bytes([0x82, opcode, 0x14, 0xFF, 0x00, slot, 0x00, 0x01]) + bytes(8) + bytes(range(16))
    info = bytes([4, 0x0A]) + struct.pack("<H", 8) + struct.pack("<I", cbank_sym) + b"\x10\x02\x98\x00"
    rela = struct.pack("<QQq", 4 * slot, symbols.index(sym_of_slot) << 32, 0)
    reloc = struct.pack("<QQq", 16, (rel_sym << 32) | 5, 0)
    return _elf({".text.k": text, ".nv.info.k": info, ".rela.nv.constant4": rela, ".rela.text.k": reloc,
                 ".nv.constant0.k": bytes(8)}, symbols)


def test_same_kernel_accepts_only_layout_differences():
    alone = _kernel(14, "tbl", cbank_sym=1)
    assert kg.has_kernels(alone, ["k"]) and not kg.has_kernels(alone, ["k", "q"])
    assert kg.kernel_sections(alone, "k") == [".nv.constant0.k", ".nv.info.k", ".rela.text.k", ".text.k"]
    assert kg.same_kernel(alone, alone, "k")
    assert kg.same_kernel(alone, _kernel(76, "tbl", cbank_sym=1), "k")        # same symbol, other slot
    assert not kg.same_kernel(alone, _kernel(76, "other", cbank_sym=1), "k")  # another symbol there
    assert not kg.same_kernel(alone, _kernel(14, "tbl", cbank_sym=1, opcode=0x7C), "k")   # other code
    assert not kg.same_kernel(alone, _kernel(14, "tbl", cbank_sym=3), "k")    # parameter bank elsewhere
    assert not kg.same_kernel(alone, _kernel(14, "tbl", cbank_sym=1, rel_sym=3), "k")     # call target
    assert not kg.same_kernel(alone, alone, "q")                               # no such kernel


@pytest.mark.parametrize("nvrtc", [pytest.param("cupy", marks=pytest.mark.gpu), "ctypes"])
def test_merged_kernels_match_kernels_compiled_alone(nvrtc):
    """The manifest's first three merged programs (about 40 kernels, ~20 s on one core):
    every kernel the same as compiled alone, up to the module layout; with CuPy's NVRTC on a
    GPU machine, or any libnvrtc through ctypes (ADAPTMG_TEST_NVRTC, ADAPTMG_TEST_CUPY_INCLUDE)."""
    bench = runpy.run_path(os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench_kernel_groups.py"))
    if nvrtc == "cupy":
        if km.load()["nvrtc"] != list(__import__("cupy.cuda.compiler").cuda.compiler._get_nvrtc_version()):
            pytest.skip("the shipped manifest was recorded with another NVRTC")
        c = bench["cupy_compiler"]()
    elif os.environ.get("ADAPTMG_TEST_NVRTC") and os.environ.get("ADAPTMG_TEST_CUPY_INCLUDE"):
        c = bench["ctypes_compiler"](os.environ["ADAPTMG_TEST_NVRTC"], os.environ["ADAPTMG_TEST_CUPY_INCLUDE"], "90")
    else:
        pytest.skip("set ADAPTMG_TEST_NVRTC (a libnvrtc.so) and ADAPTMG_TEST_CUPY_INCLUDE")

    def compile_(source, options):
        return c(source, options, True)
    entries = km._ordered(km.load())
    units = [u for u in kg.groups(entries) if len(u) > 1][:3]
    v = kg.verify(entries, units, compile_)
    assert v["different"] == [] and v["same"] == sum(len(u) for u in units)
