"""Which BLAS this PyTorch process runs on: the resolved path of the BLAS library mapped into
the process. Debian's torch links libblas.so.3, an update-alternatives link that points at the
OpenMP or the pthread build of OpenBLAS (or reference BLAS) depending on what is installed, and
that choice alone changes PyTorch's MoE times by up to 2x here (the pthread build's threads
compete with torch's OpenMP workers). Benchmarks print it next to their PyTorch numbers."""
import ctypes
import os


def blas_library():
    """The real path of the first BLAS library in /proc/self/maps, or 'unknown'."""
    try:
        with open("/proc/self/maps") as f:
            paths = [line.split()[-1] for line in f if "/" in line]
    except OSError:
        return "unknown"
    for name in ("libopenblas", "libblas", "libmkl_rt", "libblis"):
        for p in paths:
            if os.path.basename(p).startswith(name):
                return os.path.realpath(p)
    return _torch_builtin()[0]


def _torch_builtin():
    """PyTorch from PyPI links MKL into libtorch_cpu: no BLAS library is mapped. Its build
    configuration says which, and get_cpu_capability which kernels (AVX2, AVX512)."""
    try:
        import torch
        cfg = torch.__config__.show()
        isa = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
        return ("MKL" if "USE_MKL=ON" in cfg else "built-in BLAS") + " in libtorch_cpu", isa
    except (ImportError, AttributeError):
        return "unknown", "unknown"


def blas_kernel():
    """OpenBLAS's kernel family in this process (openblas_get_corename), or 'unknown'."""
    path = blas_library()
    if path.endswith("libtorch_cpu"):
        return _torch_builtin()[1]
    try:
        lib = ctypes.CDLL(path)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown"
