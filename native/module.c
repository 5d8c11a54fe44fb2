/*
 * agentmem._native: CPython bindings of the codec kernels (kernels.h).
 *
 * Every function takes objects supporting the buffer protocol (bytes, bytearray,
 * memoryview, numpy arrays), checks their sizes, and runs the kernel with the GIL
 * released. Size errors raise ValueError; the Python layer (agentmem.codec.kernels)
 * turns them into CodecError where they come from untrusted data.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "kernels.h"

static int check_type_rot(int type, int rot) {
    if (type != AM_TYPE_Q8_0 && type != AM_TYPE_Q4_0) {
        PyErr_Format(PyExc_ValueError, "unknown quantized type %d (expected 8 = q8_0 or 2 = q4_0)", type);
        return -1;
    }
    if (rot != 0 && rot != 32 && rot != 64) {
        PyErr_Format(PyExc_ValueError, "rotation block must be 0, 32 or 64, not %d", rot);
        return -1;
    }
    return 0;
}

static PyObject *py_encoded_size(PyObject *self, PyObject *args) {
    int type, rot;
    Py_ssize_t n;
    (void)self;
    if (!PyArg_ParseTuple(args, "ini:encoded_size", &type, &n, &rot)) {
        return NULL;
    }
    if (check_type_rot(type, rot) < 0) {
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    return PyLong_FromSize_t(am_encoded_size(type, (size_t)n, rot));
}

/* quantize(type, src, dst, n, rot): src holds >= n f16, dst >= encoded_size bytes. */
static PyObject *py_quantize(PyObject *self, PyObject *args) {
    int type, rot;
    Py_ssize_t n;
    Py_buffer src, dst;
    (void)self;
    if (!PyArg_ParseTuple(args, "iy*w*ni:quantize", &type, &src, &dst, &n, &rot)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (check_type_rot(type, rot) < 0) {
        goto done;
    }
    if (n < 0 || src.len / 2 < n) {
        PyErr_Format(PyExc_ValueError, "source holds %zd bytes, %zd f16 values need %zd", src.len, n, 2 * n);
        goto done;
    }
    const size_t need = am_encoded_size(type, (size_t)n, rot);
    if ((size_t)dst.len < need) {
        PyErr_Format(PyExc_ValueError, "destination holds %zd bytes, %zu needed", dst.len, need);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    am_quantize(type, (const uint8_t *)src.buf, (size_t)n, (uint8_t *)dst.buf, rot);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* dequantize(type, src, dst, n, rot): src holds >= encoded_size bytes, dst >= 2n. */
static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    int type, rot;
    Py_ssize_t n;
    Py_buffer src, dst;
    (void)self;
    if (!PyArg_ParseTuple(args, "iy*w*ni:dequantize", &type, &src, &dst, &n, &rot)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (check_type_rot(type, rot) < 0) {
        goto done;
    }
    if (n < 0 || dst.len / 2 < n) {
        PyErr_Format(PyExc_ValueError, "destination holds %zd bytes, %zd f16 values need %zd", dst.len, n, 2 * n);
        goto done;
    }
    const size_t need = am_encoded_size(type, (size_t)n, rot);
    if ((size_t)src.len < need) {
        PyErr_Format(PyExc_ValueError, "source holds %zd bytes, %zu needed", src.len, need);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    am_dequantize(type, (const uint8_t *)src.buf, (size_t)n, (uint8_t *)dst.buf, rot);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* hadamard(buf, block): in place on float32 values, groups of block (32 or 64). */
static PyObject *py_hadamard(PyObject *self, PyObject *args) {
    int block;
    Py_buffer buf;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*i:hadamard", &buf, &block)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (block != 32 && block != 64) {
        PyErr_Format(PyExc_ValueError, "Hadamard block must be 32 or 64, not %d", block);
        goto done;
    }
    if (buf.len % (4 * (Py_ssize_t)block) != 0) {
        PyErr_Format(PyExc_ValueError, "buffer of %zd bytes is not a whole number of %d-float groups", buf.len, block);
        goto done;
    }
    float *x = (float *)buf.buf;
    const size_t n = (size_t)buf.len / 4;
    Py_BEGIN_ALLOW_THREADS
    am_hadamard_f32(x, n, block);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&buf);
    return result;
}

/* run_plan(plan, src, dst, rot): plan is a C-contiguous int64 buffer of 6-column rows. */
static PyObject *py_run_plan(PyObject *self, PyObject *args) {
    Py_buffer plan, src, dst;
    int rot, rc;
    size_t bad = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*w*i:run_plan", &plan, &src, &dst, &rot)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (plan.len % (Py_ssize_t)(AM_PLAN_COLS * sizeof(int64_t)) != 0 || ((uintptr_t)plan.buf % sizeof(int64_t)) != 0) {
        PyErr_SetString(PyExc_ValueError, "plan must be an aligned int64 buffer of 6-column rows");
        goto done;
    }
    const size_t n_steps = (size_t)plan.len / (AM_PLAN_COLS * sizeof(int64_t));
    Py_BEGIN_ALLOW_THREADS
    rc = am_run_plan((const int64_t *)plan.buf, n_steps, (const uint8_t *)src.buf, (size_t)src.len,
                     (uint8_t *)dst.buf, (size_t)dst.len, rot, &bad);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_Format(PyExc_ValueError, "plan step %zu is out of bounds or inconsistent (rot=%d)", bad, rot);
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&plan);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

static PyObject *py_checksum(PyObject *self, PyObject *args) {
    Py_buffer buf;
    uint64_t h;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*:checksum", &buf)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    h = am_checksum((const uint8_t *)buf.buf, (size_t)buf.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLongLong((unsigned long long)h);
}

static PyObject *py_simd(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(am_simd_active() ? "avx2+f16c" : "portable");
}

static PyObject *py_simd_available(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(am_simd_available());
}

static PyObject *py_set_simd(PyObject *self, PyObject *args) {
    int enabled;
    (void)self;
    if (!PyArg_ParseTuple(args, "p:set_simd", &enabled)) {
        return NULL;
    }
    return PyBool_FromLong(am_simd_set(enabled));
}

static PyMethodDef methods[] = {
    {"encoded_size", py_encoded_size, METH_VARARGS,
     "encoded_size(type, n, rot) -> int: bytes of n f16 values quantized to type (8 = q8_0, 2 = q4_0)."},
    {"quantize", py_quantize, METH_VARARGS,
     "quantize(type, src, dst, n, rot) -> None: n f16 values of src into ggml blocks in dst."},
    {"dequantize", py_dequantize, METH_VARARGS,
     "dequantize(type, src, dst, n, rot) -> None: ggml blocks of src into n f16 values in dst."},
    {"hadamard", py_hadamard, METH_VARARGS,
     "hadamard(buf, block) -> None: normalized Hadamard transform of float32 groups, in place."},
    {"run_plan", py_run_plan, METH_VARARGS,
     "run_plan(plan, src, dst, rot) -> None: run a checked transcode plan (int64 rows: op, type, "
     "src_off, src_len, dst_off, dst_len; op 0 copy, 1 quantize, 2 dequantize)."},
    {"checksum", py_checksum, METH_VARARGS, "checksum(buf) -> int: the 64-bit mulfold64 checksum."},
    {"simd", py_simd, METH_NOARGS, "simd() -> str: 'avx2+f16c' or 'portable' (the kernels in use)."},
    {"simd_available", py_simd_available, METH_NOARGS, "simd_available() -> bool."},
    {"set_simd", py_set_simd, METH_VARARGS,
     "set_simd(enabled) -> bool: use the SIMD kernels when available (tests); returns the previous setting."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    "agentmem._native",
    "Native q8_0/q4_0 codec kernels of agentmem (see native/kernels.h).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    am_simd_active(); /* decide once, before any thread can race on it */
    return PyModule_Create(&moduledef);
}
