"""Several manifest kernels in one NVRTC program: one header parse for many kernels.

Most of a CuPy kernel's compile is NVRTC parsing CuPy's headers (NVRTC 13.0.88 through
ctypes, one process, sm_90: an element-wise kernel 0.12 s, of which its four ``#include``
lines alone take ~0.10 s and an empty program 0.04 s; a CUB reduction pass 1.6 s, nearly
all of it ``cub/block/*.cuh``; ptxas a few hundredths).
:func:`merged_source` puts ``n`` manifest entries that share their options and their
``#include`` lines into one program

    #include <...>                        (each header once, at the top)
    #pragma push_macro("M")               (for every macro M entry k defines)
    namespace adaptmg_merged_k { <entry k without its #include lines> }
    #undef M / #pragma pop_macro("M")

so each entry's typedefs, helpers and macros stay its own, while its ``extern "C"``
kernels keep their names (C linkage ignores the namespace).  The worker
(:mod:`.kernel_manifest`) compiles that program once with the options CuPy gives the
first entry and stores the cubin under *every* entry's own CuPy cache key: CuPy loads a
cached module and takes its function by name, so the other kernels in the cubin are
inert.  What may be merged (:func:`groups`): entries with ``#include`` lines (no header
parse, nothing to share), whose every ``__global__`` is ``extern "C"`` with a name no
other entry of the group uses, without ``namespace``, explicit specialisations
(``template <>``) or ``extern "C" {`` blocks (which a namespace would change), and
without ``name_expressions`` / ``jitify``.  :func:`verify` compares each kernel's code
sections (``.text.<name>``, its constant bank, shared memory and attributes) in the
merged cubin with those of the entry compiled alone: ``scripts/bench_kernel_groups.py``
runs it over the shipped manifest (NVRTC 13.0.88: all 310 merged kernels the same; sin and
cos differ only in the address-table slot they read), ``tests/device/test_kernel_groups.py``
on the first units with the machine's own NVRTC.
"""
from __future__ import annotations

import json
import re
import struct

__all__ = ["kernel_names", "groups", "merged_source", "has_kernels", "kernel_sections", "same_kernel", "verify"]

_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b.*$", re.M)
_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)
_BOUNDS = re.compile(r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)")
_EXTERN_C = re.compile(r'extern\s+"C"[^(;{]*?(\w+)\s*\(')
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_UNSAFE = re.compile(r'\bnamespace\b|\btemplate\s*<\s*>|extern\s+"C"\s*\{')
GROUP_SIZE = 16


def _key(name):
    """The entry fields that must be equal within a group (all but the source)."""
    return lambda e: json.dumps({k: v for k, v in e.items() if k != name}, sort_keys=True)


def includes(source):
    """The ``#include`` lines of ``source``, stripped, in order."""
    return tuple(line.strip() for line in _INCLUDE.findall(source))


def kernel_names(entry):
    """The ``extern "C"`` names an entry defines, or None when it must be compiled alone."""
    src = _COMMENT.sub(" ", entry.get("source", ""))
    if entry.get("name_expressions") or entry.get("jitify") or not includes(src) or _UNSAFE.search(src):
        return None
    names = _EXTERN_C.findall(_BOUNDS.sub(" ", src))
    if not names or src.count("__global__") != len(names) or len(set(names)) != len(names):
        return None
    return names


def groups(entries, size=GROUP_SIZE):
    """Partition ``range(len(entries))`` into compile units, in the entries' order (a unit's
    position is that of its first entry): entries that may be merged (:func:`kernel_names`)
    with equal options and ``#include`` lines, at most ``size`` per unit, no kernel name
    twice in a unit; every other entry a unit of its own."""
    if int(size) < 1:
        raise ValueError(f"group size must be >= 1, got {size!r}")
    units, open_units, rest = [], {}, _key("source")
    for i, e in enumerate(entries):
        names = kernel_names(e) if size > 1 else None
        if names is None:
            units.append([i])
            continue
        slots = open_units.setdefault((rest(e), includes(e["source"])), [])
        for unit, taken in slots:
            if len(unit) < size and taken.isdisjoint(names):
                unit.append(i)
                taken.update(names)
                break
        else:
            units.append([i])
            slots.append((units[-1], set(names)))
    return units


def merged_source(sources):
    """One program of ``sources`` (see the module docstring)."""
    head, body = [], []
    for k, src in enumerate(sources):
        for line in includes(src):
            if line not in head:
                head.append(line)
        macros = sorted(set(_DEFINE.findall(src)))
        body += [f'#pragma push_macro("{m}")' for m in macros]
        body += [f"namespace adaptmg_merged_{k} {{", _INCLUDE.sub("", src), f"}}  // adaptmg_merged_{k}"]
        body += [f'#undef {m}\n#pragma pop_macro("{m}")' for m in macros]
    return "\n".join(head + body) + "\n"


def has_kernels(cubin, names):
    """Whether the cubin (ELF) has a code section for each of ``names``."""
    return all(b"\0.text." + n.encode() + b"\0" in cubin for n in names)


def _sections(elf):
    """``{name: bytes}`` of an ELF64 little-endian image (NOBITS sections: their size)."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    entsize, count, strndx = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", elf, shoff + i * entsize) for i in range(count)]
    names = heads[strndx][4]
    out = {}
    for name, kind, _, _, off, size in heads:
        label = elf[names + name:elf.index(b"\0", names + name)].decode()
        out[label] = struct.pack("<Q", size) if kind == 8 else elf[off:off + size]
    return out


class _Cubin:
    """A cubin's sections, symbol names and module address table (constant bank 4: slot
    offset -> the symbol whose address the loader puts there)."""

    def __init__(self, elf):
        self.sec = _sections(elf)
        tab, strs = self.sec.get(".symtab", b""), self.sec.get(".strtab", b"")
        self.sym = [strs[o:strs.index(b"\0", o)].decode()
                    for o, in (struct.unpack_from("<I", tab, k) for k in range(0, len(tab), 24))]
        rel = self.sec.get(".rela.nv.constant4", b"")
        self.bank4 = {off: (self.sym[info >> 32], add) for off, info, add in
                      (struct.unpack_from("<QQq", rel, k) for k in range(0, len(rel), 24))}

    def info(self, name):
        """The kernel's attribute records, the symbol index of its parameter bank
        (EIATTR_PARAM_CBANK) as the symbol's name."""
        b, k, out = self.sec[".nv.info." + name], 0, []
        while k + 4 <= len(b):                  # format, attribute, 2 bytes: value or size
            fmt, attr = b[k], b[k + 1]
            n = struct.unpack_from("<H", b, k + 2)[0] if fmt == 4 else 0
            body = b[k + 4:k + 4 + n] if fmt == 4 else b[k + 2:k + 4]
            if attr == 0x0A and len(body) >= 4:
                body = (self.sym[struct.unpack_from("<I", body)[0]], body[4:])
            out.append((fmt, attr, body))
            k += 4 + n
        return out

    def relocs(self, section):
        b = self.sec.get(section, b"")
        return [(off, info & 0xFFFFFFFF, self.sym[info >> 32], add)
                for off, info, add in (struct.unpack_from("<QQq", b, k) for k in range(0, len(b), 24))]

    def slot(self, instr):
        """The bank-4 symbol an instruction's constant operand (bytes 5-6, in words) names."""
        return self.bank4.get(4 * int.from_bytes(instr[5:7], "little"))


def kernel_sections(cubin, name):
    """The section names of kernel ``name`` in ``cubin`` (code, constant bank, shared memory,
    attributes, relocations)."""
    return sorted(k for k in _sections(cubin) if k.endswith("." + name))


def same_kernel(alone, merged, name):
    """Whether kernel ``name`` is the same in two cubins: the same sections, byte for byte,
    up to what the module layout decides -- symbol indices (in the attributes and the
    relocations, compared by symbol name) and the slots of the module's address table
    (constant bank 4) that an instruction reads, compared by the symbol loaded there."""
    a, b = _Cubin(alone), _Cubin(merged)
    mine = sorted(k for k in a.sec if k.endswith("." + name))
    if not mine or mine != sorted(k for k in b.sec if k.endswith("." + name)):
        return False
    for k in mine:
        x, y = a.sec[k], b.sec[k]
        if x == y:
            continue
        if k.startswith(".nv.info."):
            if a.info(name) != b.info(name):
                return False
        elif k.startswith(".rel"):
            if a.relocs(k) != b.relocs(k):
                return False
        elif k.startswith(".text.") and len(x) == len(y) and len(x) % 16 == 0:
            for o in range(0, len(x), 16):
                p, q = x[o:o + 16], y[o:o + 16]
                if p != q and (p[:5] + p[7:] != q[:5] + q[7:] or a.slot(p) is None or a.slot(p) != b.slot(q)):
                    return False
        else:
            return False
    return True


def verify(entries, units, compile_one):
    """Compile every unit of ``units`` with more than one entry as one program and each of its
    entries alone (``compile_one(source, options) -> cubin``) and compare each kernel's
    sections; returns ``{"same": n, "different": [(entry index, kernel name), ...]}``."""
    same, different = 0, []
    for unit in units:
        if len(unit) < 2:
            continue
        merged = compile_one(merged_source([entries[i]["source"] for i in unit]), entries[unit[0]]["options"])
        for i in unit:
            alone = compile_one(entries[i]["source"], entries[i]["options"])
            for n in kernel_names(entries[i]):
                if same_kernel(alone, merged, n):
                    same += 1
                else:
                    different.append((i, n))
    return {"same": same, "different": different}
