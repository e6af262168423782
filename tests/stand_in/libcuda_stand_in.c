/*
 * A stand-in for the CUDA driver library (libcuda.so.1) on a machine without a GPU, for ckptqual's TESTS ONLY.
 *
 * KvikIO asks the driver about every buffer, even in compat mode and into host memory (docs/facts.md).
 * With this library loaded (its soname is libcuda.so.1, so KvikIO's dlopen finds it), the driver answers as a
 * driver with no usable GPU: cuInit says CUDA_ERROR_NO_DEVICE (100), cuDriverGetVersion succeeds, and every
 * other call says CUDA_ERROR_NOT_INITIALIZED (3), so KvikIO treats buffers as host memory. cuGetErrorName and
 * cuGetErrorString succeed, so that KvikIO can word an error. The symbols are the ones KvikIO 26.10 looks up
 * (found with LD_DEBUG=symbols); a missing one makes KvikIO fail with "undefined symbol: cu...".
 */

typedef int CUresult;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define STAND_IN_DRIVER_VERSION 12090

#define NOT_INITIALIZED(name) \
    CUresult name(void) { return CUDA_ERROR_NOT_INITIALIZED; }

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

CUresult cuDriverGetVersion(int *version) {
    if (version) *version = STAND_IN_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **text) {
    if (text) *text = error == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_NOT_INITIALIZED";
    return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
    if (text) *text = error == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable device (ckptqual test stand-in)"
                                                    : "driver not initialized (ckptqual test stand-in)";
    return CUDA_SUCCESS;
}

/* Everything else KvikIO looks up: arguments are ignored (the x86-64 and aarch64 ABIs allow it). */
NOT_INITIALIZED(cuCtxCreate_v2)
NOT_INITIALIZED(cuCtxDestroy_v2)
NOT_INITIALIZED(cuCtxGetCurrent)
NOT_INITIALIZED(cuCtxGetDevice)
NOT_INITIALIZED(cuCtxPopCurrent_v2)
NOT_INITIALIZED(cuCtxPushCurrent_v2)
NOT_INITIALIZED(cuCtxSetCurrent)
NOT_INITIALIZED(cuDeviceGet)
NOT_INITIALIZED(cuDeviceGetAttribute)
NOT_INITIALIZED(cuDeviceGetCount)
NOT_INITIALIZED(cuDeviceGetName)
NOT_INITIALIZED(cuDevicePrimaryCtxRelease_v2)
NOT_INITIALIZED(cuDevicePrimaryCtxRetain)
NOT_INITIALIZED(cuEventCreate)
NOT_INITIALIZED(cuEventDestroy_v2)
NOT_INITIALIZED(cuEventQuery)
NOT_INITIALIZED(cuEventRecord)
NOT_INITIALIZED(cuEventSynchronize)
NOT_INITIALIZED(cuLaunchHostFunc)
NOT_INITIALIZED(cuMemAlloc_v2)
NOT_INITIALIZED(cuMemFree_v2)
NOT_INITIALIZED(cuMemFreeHost)
NOT_INITIALIZED(cuMemGetAddressRange_v2)
NOT_INITIALIZED(cuMemHostAlloc)
NOT_INITIALIZED(cuMemHostRegister_v2)
NOT_INITIALIZED(cuMemHostUnregister)
NOT_INITIALIZED(cuMemcpyAsync)
NOT_INITIALIZED(cuMemcpyBatchAsync)
NOT_INITIALIZED(cuMemcpyDtoH_v2)
NOT_INITIALIZED(cuMemcpyDtoHAsync_v2)
NOT_INITIALIZED(cuMemcpyHtoDAsync_v2)
NOT_INITIALIZED(cuPointerGetAttribute)
NOT_INITIALIZED(cuPointerGetAttributes)
NOT_INITIALIZED(cuStreamCreate)
NOT_INITIALIZED(cuStreamDestroy_v2)
NOT_INITIALIZED(cuStreamSynchronize)
