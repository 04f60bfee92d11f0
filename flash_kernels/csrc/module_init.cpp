// Makes `import flash_kernels._C` work. The module defines no Python functions: importing it loads this
// shared object, whose static TORCH_LIBRARY registrars (ops.cpp) add torch.ops.flash_kernels_cuda.*.
// Only the CPython stable ABI is used (Py_LIMITED_API is set by setup.py), so one cp39-abi3 build serves
// every CPython >= 3.9.
#include <Python.h>

static struct PyModuleDef flash_kernels_c_module = {
    PyModuleDef_HEAD_INIT,
    "_C",
    "flash_kernels CUDA kernels; the ops are torch.ops.flash_kernels_cuda.{fwd,bwd,compiled_head_dims}",
    -1,
    nullptr,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&flash_kernels_c_module); }
