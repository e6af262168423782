"""ckptqual's native kernels: C built at install into one optional library (`library`), called through ctypes
without the GIL. Where the library is not built, the code that would call it runs its Python path instead."""
