"""Compiled kernels shipped with the package: the manifest's cubins, per GPU architecture.

A process that meets empty kernel caches compiles every kernel it uses (NVRTC, ~0.24 s
each); the prefetch of :mod:`.kernel_manifest` spreads that over worker processes, but the
first run on a machine still waits for them (a 340k-DoF ``multigrid()`` set-up and solve:
6.5-10 s to the solution from empty caches on an H200 host, 1 s once the kernels are
cached).  The cubins NVRTC makes from the manifest's calls depend only on the source, the
options, the architecture and the NVRTC and CuPy versions -- not on the machine -- so they
are built once (``python -m adaptmg warmup --bundle 80,90,...`` on any machine with CuPy and
NVRTC; no GPU of those architectures needed) and shipped beside the manifest, one file per
architecture (``kernel_cubins_sm<arch>.bin``).

Lookup.  CuPy names a cached cubin by a hash of what it compiles, including this machine's
include paths, so a shipped cubin cannot be stored under CuPy's name ahead of time.
Instead :func:`install` wraps CuPy's compile-with-cache function so that the arguments of
the call in progress are known (a thread-local; nothing else is done per call), and the
layered cache of :mod:`.kernel_cache` asks :func:`payload` when CuPy's cache and adaptmg's
both miss.  :func:`payload` forms the call's *key* -- an MD5 of the call as a manifest
entry (this machine's paths as placeholders, :func:`.kernel_manifest.call_entry`), its
architecture and the MD5 of its ``extra_source`` -- and, when the architecture's file has
it and was built with this CuPy and NVRTC, returns the cubin (CuPy then loads it as if it
had been cached; the layered cache stores it under CuPy's name, so later processes find it
there).  Anything else -- another version, an architecture without a file, a kernel the
manifest lacks, a file that fails its checksum -- is a miss, and CuPy compiles as before.
A key covers the call's whole source text, so a changed kernel is never served a stale
cubin: it is just not found.

File format: one header line of JSON (``format``, ``cupy``, ``nvrtc``, ``arch``, the
``manifest`` hash it was built from, ``keys``: key -> [offset, size] into the payload
blob, ``size`` and ``sha256`` of the blob) followed by the xz-compressed blob of distinct
cubins (many of CuPy's reduction kernels compile to the same bytes).  The blob is
decompressed once per process, at its first hit (~27 MB of cubins per architecture, 0.3 MB
compressed).

When the file of this machine's architecture covers the whole manifest (built from the
manifest in use, same versions), :func:`.kernel_manifest.prefetch` starts no workers:
nothing is left for them to compile.  ``ADAPTMG_KERNEL_BUNDLE=0`` turns the shipped cubins
off; ``ADAPTMG_KERNEL_BUNDLE_DIR`` reads the files from another folder.  They are served
through adaptmg's layered cache, so ``ADAPTMG_KERNEL_CACHE=off`` turns them off too.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import threading

__all__ = ["bundle_path", "install", "payload", "covers", "call_key", "write", "read_header", "build"]

FORMAT = 1
_HERE = os.path.dirname(os.path.abspath(__file__))
_STATE = {"installed": False, "paths": None}
_LOCK = threading.Lock()
_LOCAL = threading.local()
_BUNDLES = {}                   # arch -> (header, blob bytes or None) | False (no usable file)
_MD5 = {}                       # extra_source text -> its MD5 (CuPy's headers: hashed once)


def bundle_path(arch, folder=None) -> str:
    """The file of architecture ``arch`` (e.g. ``"90"``) in ``folder`` (default: the package's
    folder, or ``$ADAPTMG_KERNEL_BUNDLE_DIR``)."""
    folder = folder or os.environ.get("ADAPTMG_KERNEL_BUNDLE_DIR") or _HERE
    return os.path.join(folder, f"kernel_cubins_sm{arch}.bin")


def _md5(text: str) -> str:
    h = _MD5.get(text)
    if h is None:
        h = _MD5[text] = hashlib.md5(text.encode("utf-8")).hexdigest()
    return h


def _target(compiler, arch):
    """What CuPy makes for ``arch``: ``["-arch=sm_90", "cubin"]``, or PTX where CuPy is told to
    (``CUPY_COMPILE_WITH_PTX``) or NVRTC does not know the architecture -- part of the key."""
    f = getattr(compiler, "_get_arch_for_options_for_nvrtc", None)
    return list(f(arch)) if f is not None else [f"-arch=sm_{arch}", "cubin"]


def call_key(entry: dict, arch, extra_text=None, target=None) -> str:
    """The key of a compile call given as a manifest entry (``extra_source`` left out;
    ``extra_text`` is its text) for architecture ``arch`` (used when the entry has none) and
    CuPy's ``target`` for it (:func:`_target`)."""
    # the call's arguments as given (None/False ones already left out); "backend" is the one
    # argument whose default is neither, so a call naming the default is the same call
    e = {k: v for k, v in entry.items() if k not in ("arch", "extra_source")
         and not (k == "backend" and v == "nvrtc")}
    arch = str(entry.get("arch") or arch)
    doc = [e, arch, None if extra_text is None else _md5(extra_text), target or [f"-arch=sm_{arch}", "cubin"]]
    return hashlib.md5(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def write(path, payloads: dict, *, cupy_version, nvrtc_version, arch, manifest_hash) -> dict:
    """Write a bundle file: ``payloads`` maps keys to cubins (bytes).  Returns its header."""
    blob, where, offsets = bytearray(), {}, {}
    for key in sorted(payloads):
        data = bytes(payloads[key])
        d = hashlib.sha256(data).hexdigest()
        if d not in offsets:
            offsets[d] = len(blob)
            blob += data
        where[key] = [offsets[d], len(data)]
    header = {"format": FORMAT, "cupy": cupy_version, "nvrtc": list(nvrtc_version), "arch": str(arch),
              "manifest": manifest_hash, "keys": where, "size": len(blob),
              "sha256": hashlib.sha256(blob).hexdigest()}
    packed = lzma.compress(bytes(blob), preset=9 | lzma.PRESET_EXTREME)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(json.dumps(header, separators=(",", ":")).encode("utf-8") + b"\n")
        f.write(packed)
    os.replace(tmp, path)
    return header


def read_header(path):
    """A bundle file's header (dict), or None when it is missing or not of this format."""
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline())
    except (OSError, ValueError):
        return None
    return header if isinstance(header, dict) and header.get("format") == FORMAT else None


def _enabled() -> bool:
    """Whether the shipped cubins are in use (``ADAPTMG_KERNEL_BUNDLE``, on unless 0/off/...)."""
    from .kernel_manifest import _OFF
    return os.environ.get("ADAPTMG_KERNEL_BUNDLE", "1").strip().lower() not in _OFF


def _bundle(arch):
    """(header, blob) of ``arch``'s file when it matches this CuPy and NVRTC, else False;
    the blob is None until :func:`_blob` decompresses it."""
    got = _BUNDLES.get(arch)
    if got is None:
        header = read_header(bundle_path(arch))
        ok = header is not None and header.get("arch") == str(arch)
        if ok:
            from .kernel_manifest import versions
            cupy_v, nvrtc_v = versions()
            ok = header["cupy"] == cupy_v and list(header["nvrtc"]) == nvrtc_v
        got = _BUNDLES[arch] = [header, None] if ok else False
    return got


def _blob(bundle, arch):
    """The decompressed blob of ``bundle`` (once per process; a file that fails its checksum
    is dropped: every later lookup misses and CuPy compiles)."""
    if bundle[1] is None:
        header = bundle[0]
        try:
            with open(bundle_path(arch), "rb") as f:
                f.readline()
                blob = lzma.decompress(f.read())
        except (OSError, lzma.LZMAError):
            blob = b""
        if len(blob) != header["size"] or hashlib.sha256(blob).hexdigest() != header["sha256"]:
            _BUNDLES[arch] = False
            return None
        bundle[1] = blob
    return bundle[1]


def payload():
    """The shipped cubin of the compile call in progress on this thread, or None (see the
    module docstring).  Called by the layered cache when both caches miss."""
    call = getattr(_LOCAL, "call", None)
    if call is None:
        return None
    arguments, compiler = call
    if arguments.get("cache_in_memory") or arguments.get("to_ltoir"):
        return None
    from .kernel_manifest import _paths, call_entry
    with _LOCK:
        if _STATE["paths"] is None:
            _STATE["paths"] = _paths()
        arch = str(arguments.get("arch") or compiler._get_arch())
        bundle = _bundle(arch)
        if not bundle:
            return None
        entry = call_entry(arguments, _STATE["paths"])
        key = call_key(entry, arch, entry.get("extra_source"), _target(compiler, arch))
        where = bundle[0]["keys"].get(key)
        if where is None:
            return None
        blob = _blob(bundle, arch)
        if blob is None:
            return None
        start, size = where
        return blob[start:start + size]


def covers(manifest_hash: str, arch) -> bool:
    """Whether ``arch``'s file was built from the manifest with this hash (MD5 of its bytes)
    with this process's CuPy and NVRTC: then every manifest kernel is served from it."""
    if not _enabled():
        return False
    with _LOCK:
        bundle = _bundle(str(arch))
    return bool(bundle) and bundle[0].get("manifest") == manifest_hash


def install(compiler) -> bool:
    """Wrap ``compiler._compile_with_cache_cuda`` so that :func:`payload` sees the call in
    progress (idempotent).  Off with ``ADAPTMG_KERNEL_BUNDLE=0``.  Returns whether it is
    installed."""
    if _STATE["installed"]:
        return True
    if not _enabled():
        return False
    orig = getattr(compiler, "_compile_with_cache_cuda", None)
    if orig is None:
        return False
    import inspect
    try:
        sig = inspect.signature(orig)
    except (TypeError, ValueError):                     # pragma: no cover - a compiled function
        return False

    def with_call_known(*args, **kw):
        try:
            arguments = sig.bind(*args, **kw).arguments
        except TypeError:                               # let CuPy raise its own error
            return orig(*args, **kw)
        outer = getattr(_LOCAL, "call", None)
        _LOCAL.call = (arguments, compiler)
        try:
            return orig(*args, **kw)
        finally:
            _LOCAL.call = outer

    with_call_known.__wrapped__ = orig
    compiler._compile_with_cache_cuda = with_call_known
    _STATE["installed"] = True
    return True


class _Named(Exception):
    """Raised by :class:`_NameOnly` with the cache name CuPy computed for a call."""


class _NameOnly:
    """A CuPy cache backend that stops the compile call at its cache lookup, reporting the
    name (so a name costs CuPy's key computation, not a compile)."""

    def load(self, name):
        raise _Named(name)

    def save(self, name, cubin, source):                # pragma: no cover - never reached
        pass


def _cupy_name(compiler, kw):
    """CuPy's cache name for the compile call ``kw`` in this process."""
    prev = compiler._kernel_cache_backend
    compiler._set_kernel_cache_backend(_NameOnly())
    try:
        compiler._compile_with_cache_cuda(**kw)
    except _Named as n:
        return n.args[0]
    finally:
        compiler._set_kernel_cache_backend(prev)
    raise RuntimeError("CuPy's compile call did not look its kernel up in the cache")  # pragma: no cover


def build(archs, folder=None, jobs=None, manifest=None, log=print):
    """Compile the manifest's kernels for each architecture in ``archs`` (worker processes:
    :func:`.kernel_manifest.prefetch` into empty temporary caches) and write each one's bundle
    file into ``folder``.  Needs CuPy and NVRTC, not a GPU of those architectures.  Returns
    ``{arch: (kernels stored, kernels that did not compile)}``."""
    import tempfile

    import cupy.cuda.compiler as compiler
    from . import kernel_manifest as km
    manifest = manifest or km.MANIFEST
    with open(manifest, "rb") as f:
        mhash = hashlib.md5(f.read()).hexdigest()
    doc = km.load(manifest)
    if doc is None:
        raise ValueError(f"no kernel manifest of this format at {manifest}")
    cupy_v, nvrtc_v = km.versions(compiler)
    if doc["cupy"] != cupy_v or list(doc["nvrtc"]) != nvrtc_v:
        raise ValueError(f"the manifest was recorded with CuPy {doc['cupy']} / NVRTC {doc['nvrtc']}, this process "
                         f"has {cupy_v} / {nvrtc_v}: re-record it (adaptmg warmup --record) first")
    paths, extras, out = km._paths(), doc["extra_sources"], {}
    os.makedirs(folder or os.path.dirname(bundle_path("0")), exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("ADAPTMG_KERNEL_CACHE", "CUPY_CACHE_DIR", "ADAPTMG_PREFETCH")}
    for arch in (str(a) for a in archs):
        with tempfile.TemporaryDirectory(prefix=f"adaptmg-bundle-sm{arch}-") as tmp:
            os.environ["ADAPTMG_KERNEL_CACHE"] = os.path.join(tmp, "adaptmg")
            os.environ["CUPY_CACHE_DIR"] = os.path.join(tmp, "cupy")
            os.environ["ADAPTMG_PREFETCH"] = "1"         # asked for: whatever the environment says
            try:
                procs = km.prefetch(jobs=jobs, path=manifest, wait=True, arch=arch, bundled="compile")
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            if not procs:
                raise RuntimeError(f"sm_{arch}: the manifest's workers did not start")
            disk = compiler._DiskKernelCacheBackend(os.path.join(tmp, "adaptmg"))
            payloads, missing = {}, 0
            target = _target(compiler, arch)
            for e in doc["entries"]:
                data = disk.load(_cupy_name(compiler, km.call_kwargs(e, paths, extras, arch)))
                if data is None:
                    missing += 1
                    continue
                text = extras[e["extra_source"]] if "extra_source" in e else None
                payloads[call_key(e, arch, text, target)] = data
        header = write(bundle_path(arch, folder), payloads, cupy_version=cupy_v, nvrtc_version=nvrtc_v,
                       arch=arch, manifest_hash=mhash if not missing else None)
        out[arch] = (len(payloads), missing)
        log(f"sm_{arch}: {len(payloads)} kernels ({header['size'] / 2**20:.1f} MB, "
            f"{os.path.getsize(bundle_path(arch, folder)) / 2**20:.2f} MB compressed)"
            + (f", {missing} did not compile" if missing else ""))
    return out
