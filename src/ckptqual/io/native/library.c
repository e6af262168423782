/* What the library was built from: the SHA-256 of its C sources, which library.py compares with the files beside it
 * before it uses the library (a stale build is never used). */

#ifndef CKPTQUAL_NATIVE_SOURCE
#error "build with -DCKPTQUAL_NATIVE_SOURCE=\"<sha256 of the sources>\" (ckptqual.io.native.library.build)"
#endif

const char *ckptqual_native_source(void) { return CKPTQUAL_NATIVE_SOURCE; }
