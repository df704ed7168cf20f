"""Device memory for the Python tests, from the CUDA driver that
MOONLET_CUDA_DRIVER names (in CI the fake driver, tests/gpu/fakecuda.c,
whose device memory the host cannot touch: a stray ctypes access to it kills
the test).  Memory is filled and read back by driver copies only.

    gpu = FakeGPU()            # None-safe: FakeGPU.available() first
    p = gpu.alloc(n, device=1)
    gpu.write(p, data); gpu.read(p, n); gpu.free(p)
"""
import ctypes
import os


class FakeGPU:
    def __init__(self):
        lib = os.environ.get("MOONLET_CUDA_DRIVER")
        if not lib:
            raise RuntimeError("MOONLET_CUDA_DRIVER is not set")
        self.cu = ctypes.CDLL(lib)
        self._check(self.cu.cuInit(0), "cuInit")
        n = ctypes.c_int()
        self._check(self.cu.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
        self.devices = n.value
        self.ctx = []
        for d in range(self.devices):
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self._check(self.cu.cuDeviceGet(ctypes.byref(dev), d), "cuDeviceGet")
            self._check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev),
                        "cuDevicePrimaryCtxRetain")
            self.ctx.append(ctx)
        self._owner = {}

    @staticmethod
    def available():
        return bool(os.environ.get("MOONLET_CUDA_DRIVER"))

    @staticmethod
    def _check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: CUDA error {rc}")

    def _use(self, device):
        self._check(self.cu.cuCtxSetCurrent(self.ctx[device]), "cuCtxSetCurrent")

    def alloc(self, n, device=0):
        self._use(device)
        p = ctypes.c_ulonglong()
        self._check(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), "cuMemAlloc")
        self._owner[p.value] = device
        return p.value

    def free(self, p):
        self._use(self._owner.pop(p))
        self._check(self.cu.cuMemFree_v2(ctypes.c_ulonglong(p)), "cuMemFree")

    def write(self, p, data):
        data = bytes(data)
        self._check(self.cu.cuMemcpyHtoD_v2(ctypes.c_ulonglong(p), data,
                                            ctypes.c_size_t(len(data))), "cuMemcpyHtoD")

    def read(self, p, n):
        out = ctypes.create_string_buffer(n)
        self._check(self.cu.cuMemcpyDtoH_v2(out, ctypes.c_ulonglong(p), ctypes.c_size_t(n)),
                    "cuMemcpyDtoH")
        return out.raw

    def memset(self, p, n):
        self.write(p, bytes(n))
