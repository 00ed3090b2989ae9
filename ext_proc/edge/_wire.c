/* The compiled twin of ext_proc/edge/wire.py's ``read``: the few fields of a
 * ProcessingRequest the codec reads, from the message's bytes. wire.py is the
 * reference and its docstrings the specification; every function here is the one of the
 * same name there, branch for branch, and raises wire.Unreadable where it does
 * (tests/edge/test_wire.py compares the two, and both with upb).
 *
 * Every read is bounded by the end of the field being read, itself checked against
 * its parent's end before anything inside it is read: no byte past the buffer is ever
 * touched. Varints are accumulated in uint64_t (no signed overflow; bits past 64
 * dropped, as upb drops them). The module keeps no mutable state: its state holds the
 * wire module's Request and Unreadable and the kind names, set once at import. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define DEPTH 16

typedef struct {
    PyObject *request;    /* wire.Request */
    PyObject *unreadable; /* wire.Unreadable */
    PyObject *kinds[8];   /* "", then request_headers .. response_trailers (fields 2..7) */
    PyObject *null_value, *number_value, *string_value, *bool_value, *struct_value,
        *list_value;
    PyObject *empty_set;
} State;

typedef struct {
    State *st;
    const uint8_t *d;
} Reader;

static int unreadable(const Reader *r, const char *why) {
    PyErr_SetString(r->st->unreadable, why);
    return -1;
}

static int varint(const Reader *r, Py_ssize_t *pos, Py_ssize_t end, uint64_t *out) {
    uint64_t result = 0;
    for (int i = 0; i < 10 && *pos < end; i++) {
        uint8_t byte = r->d[(*pos)++];
        result |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (byte < 0x80) {
            *out = result;
            return 0;
        }
    }
    return unreadable(r, "varint");
}

static int tag(const Reader *r, Py_ssize_t *pos, Py_ssize_t end, uint32_t *number, int *wire) {
    Py_ssize_t start = *pos;
    uint64_t value;
    if (varint(r, pos, end, &value) < 0)
        return -1;
    if (*pos - start > 5 || value > 0xFFFFFFFFu || (value >> 3) == 0)
        return unreadable(r, "tag");
    *number = (uint32_t)(value >> 3);
    *wire = (int)(value & 7);
    return 0;
}

/* A length-delimited field: its content from *pos (moved past the length) to *stop. */
static int length(const Reader *r, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t *stop) {
    uint64_t size;
    Py_ssize_t start = *pos;
    if (varint(r, pos, end, &size) < 0)
        return -1;
    /* upb reads a length in at most five bytes (a longer one, padded, is refused). */
    if (*pos - start > 5 || size > (uint64_t)(end - *pos))
        return unreadable(r, "length");
    *stop = *pos + (Py_ssize_t)size;
    return 0;
}

static int skip(const Reader *r, int wire, Py_ssize_t *pos, Py_ssize_t end) {
    uint64_t ignored;
    Py_ssize_t stop;
    if (wire == 0)
        return varint(r, pos, end, &ignored);
    if (wire == 2) {
        if (length(r, pos, end, &stop) < 0)
            return -1;
        *pos = stop;
        return 0;
    }
    Py_ssize_t size = wire == 1 ? 8 : wire == 5 ? 4 : 0;
    if (size == 0 || size > end - *pos)
        return unreadable(r, "wire type");
    *pos += size;
    return 0;
}

/* The UTF-8 text of d[start:stop], a new reference; NULL with Unreadable set. */
static PyObject *text(const Reader *r, Py_ssize_t start, Py_ssize_t stop) {
    PyObject *decoded =
        PyUnicode_DecodeUTF8((const char *)r->d + start, stop - start, "strict");
    if (decoded == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        unreadable(r, "utf-8");
    }
    return decoded;
}

static int check_text(const Reader *r, Py_ssize_t start, Py_ssize_t stop) {
    PyObject *decoded = text(r, start, stop);
    if (decoded == NULL)
        return -1;
    Py_DECREF(decoded);
    return 0;
}

static int expect(const Reader *r, int wire, int wanted) {
    return wire == wanted ? 0 : unreadable(r, "wire type");
}

static int header_value(const Reader *r, Py_ssize_t pos, Py_ssize_t end, PyObject *into) {
    PyObject *key = NULL, *raw = NULL, *pair = NULL;
    int result = -1;
    while (pos < end) {
        uint32_t number;
        int wire;
        Py_ssize_t stop;
        if (tag(r, &pos, end, &number, &wire) < 0)
            goto done;
        if (number >= 1 && number <= 3) {
            if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0)
                goto done;
            if (number == 1) {
                PyObject *found = text(r, pos, stop);
                if (found == NULL)
                    goto done;
                Py_XSETREF(key, found);
            } else if (number == 2) {
                if (check_text(r, pos, stop) < 0)
                    goto done;
            } else {
                PyObject *found = PyBytes_FromStringAndSize((const char *)r->d + pos, stop - pos);
                if (found == NULL)
                    goto done;
                Py_XSETREF(raw, found);
            }
            pos = stop;
        } else if (skip(r, wire, &pos, end) < 0) {
            goto done;
        }
    }
    if (key == NULL && (key = PyUnicode_FromStringAndSize("", 0)) == NULL)
        goto done;
    if (raw == NULL && (raw = PyBytes_FromStringAndSize("", 0)) == NULL)
        goto done;
    pair = PyTuple_Pack(2, key, raw);
    if (pair == NULL)
        goto done;
    result = PyList_Append(into, pair);
done:
    Py_XDECREF(key);
    Py_XDECREF(raw);
    Py_XDECREF(pair);
    return result;
}

static int header_map(const Reader *r, Py_ssize_t pos, Py_ssize_t end, PyObject *into) {
    while (pos < end) {
        uint32_t number;
        int wire;
        Py_ssize_t stop;
        if (tag(r, &pos, end, &number, &wire) < 0)
            return -1;
        if (number == 1) {
            if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0)
                return -1;
            if (header_value(r, pos, stop, into) < 0)
                return -1;
            pos = stop;
        } else if (skip(r, wire, &pos, end) < 0) {
            return -1;
        }
    }
    return 0;
}

/* HttpHeaders: the headers into ``into``, end_of_stream into *eos. */
static int headers(const Reader *r, Py_ssize_t pos, Py_ssize_t end, PyObject *into, int *eos) {
    while (pos < end) {
        uint32_t number;
        int wire;
        Py_ssize_t stop;
        uint64_t value;
        if (tag(r, &pos, end, &number, &wire) < 0)
            return -1;
        if (number == 1) {
            if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0)
                return -1;
            if (header_map(r, pos, stop, into) < 0)
                return -1;
            pos = stop;
        } else if (number == 2) {
            return unreadable(r, "deprecated headers attributes");
        } else if (number == 3) {
            if (expect(r, wire, 0) < 0 || varint(r, &pos, end, &value) < 0)
                return -1;
            *eos = value != 0;
        } else if (skip(r, wire, &pos, end) < 0) {
            return -1;
        }
    }
    return 0;
}

static int trailers(const Reader *r, Py_ssize_t pos, Py_ssize_t end) {
    PyObject *ignored = PyList_New(0);
    if (ignored == NULL)
        return -1;
    int result = 0;
    while (pos < end && result == 0) {
        uint32_t number;
        int wire;
        Py_ssize_t stop;
        if (tag(r, &pos, end, &number, &wire) < 0) {
            result = -1;
        } else if (number == 1) {
            if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0 ||
                header_map(r, pos, stop, ignored) < 0)
                result = -1;
            else
                pos = stop;
        } else if (skip(r, wire, &pos, end) < 0) {
            result = -1;
        }
    }
    Py_DECREF(ignored);
    return result;
}

/* HttpBody: its body's span into *start, *stop (last wins), end_of_stream into *eos. */
static int body(const Reader *r, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *start,
                Py_ssize_t *stop_out, int *eos) {
    while (pos < end) {
        uint32_t number;
        int wire;
        Py_ssize_t stop;
        uint64_t value;
        if (tag(r, &pos, end, &number, &wire) < 0)
            return -1;
        if (number == 1) {
            if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0)
                return -1;
            *start = pos;
            *stop_out = stop;
            pos = stop;
        } else if (number >= 2 && number <= 4) {
            if (expect(r, wire, 0) < 0 || varint(r, &pos, end, &value) < 0)
                return -1;
            if (number == 2)
                *eos = value != 0;
        } else if (skip(r, wire, &pos, end) < 0) {
            return -1;
        }
    }
    return 0;
}

static long int32_of(uint64_t value) {
    uint32_t low = (uint32_t)(value & 0xFFFFFFFFu);
    return low >= 0x80000000u ? (long)low - 0x100000000L : (long)low;
}

static int config(const Reader *r, Py_ssize_t pos, Py_ssize_t end, long modes[2]) {
    while (pos < end) {
        uint32_t number;
        int wire;
        uint64_t value;
        if (tag(r, &pos, end, &number, &wire) < 0)
            return -1;
        if (number >= 1 && number <= 3) {
            if (expect(r, wire, 0) < 0 || varint(r, &pos, end, &value) < 0)
                return -1;
            if (number != 3)
                modes[number - 1] = int32_of(value);
        } else if (skip(r, wire, &pos, end) < 0) {
            return -1;
        }
    }
    return 0;
}

static int list_value(const Reader *r, Py_ssize_t pos, Py_ssize_t end, int depth);
static int struct_value(const Reader *r, Py_ssize_t pos, Py_ssize_t end, int depth,
                        PyObject *fields, char *remainder, Py_ssize_t *kept, PyObject *skipped);

/* A google.protobuf.Value: (kind, scalar), a new reference; NULL on error. */
static PyObject *value_of(const Reader *r, Py_ssize_t pos, Py_ssize_t end, int depth) {
    State *st = r->st;
    PyObject *kind = Py_None, *scalar = NULL;
    int seen = 0;
    while (pos < end) {
        uint32_t number;
        int wire;
        Py_ssize_t stop;
        uint64_t value;
        if (tag(r, &pos, end, &number, &wire) < 0)
            goto fail;
        if (number >= 1 && number <= 6) {
            if (seen) {
                unreadable(r, "value set twice");
                goto fail;
            }
            seen = 1;
        }
        if (number == 1 || number == 4) {
            if (expect(r, wire, 0) < 0 || varint(r, &pos, end, &value) < 0)
                goto fail;
            if (number == 1) {
                kind = st->null_value;
            } else {
                kind = st->bool_value;
                scalar = PyBool_FromLong(value != 0);
            }
        } else if (number == 2) {
            if (expect(r, wire, 1) < 0)
                goto fail;
            if (end - pos < 8) {
                unreadable(r, "double");
                goto fail;
            }
            double number_value = PyFloat_Unpack8((const char *)r->d + pos, 1);
            if (number_value == -1.0 && PyErr_Occurred())
                goto fail;
            scalar = PyFloat_FromDouble(number_value);
            if (scalar == NULL)
                goto fail;
            kind = st->number_value;
            pos += 8;
        } else if (number == 3 || number == 5 || number == 6) {
            if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0)
                goto fail;
            if (number == 3) {
                scalar = text(r, pos, stop);
                if (scalar == NULL)
                    goto fail;
                kind = st->string_value;
            } else if (number == 5) {
                if (struct_value(r, pos, stop, depth + 1, NULL, NULL, NULL, NULL) < 0)
                    goto fail;
                kind = st->struct_value;
            } else {
                if (list_value(r, pos, stop, depth + 1) < 0)
                    goto fail;
                kind = st->list_value;
            }
            pos = stop;
        } else if (skip(r, wire, &pos, end) < 0) {
            goto fail;
        }
    }
    PyObject *pair = PyTuple_Pack(2, kind, scalar != NULL ? scalar : Py_None);
    Py_XDECREF(scalar);
    return pair;
fail:
    Py_XDECREF(scalar);
    return NULL;
}

static int list_value(const Reader *r, Py_ssize_t pos, Py_ssize_t end, int depth) {
    if (depth > DEPTH)
        return unreadable(r, "depth");
    while (pos < end) {
        uint32_t number;
        int wire;
        Py_ssize_t stop;
        if (tag(r, &pos, end, &number, &wire) < 0)
            return -1;
        if (number == 1) {
            if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0)
                return -1;
            PyObject *value = value_of(r, pos, stop, depth);
            if (value == NULL)
                return -1;
            Py_DECREF(value);
            pos = stop;
        } else if (skip(r, wire, &pos, end) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A map entry: its key's span (*key_start == -1 when absent) and its value's span
 * (empty at ``end`` when absent). */
static int entry(const Reader *r, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t *key_start,
                 Py_ssize_t *key_stop, Py_ssize_t *value_start, Py_ssize_t *value_stop) {
    *key_start = -1;
    *key_stop = -1;
    *value_start = -1;
    *value_stop = -1;
    while (pos < end) {
        uint32_t number;
        int wire;
        Py_ssize_t stop;
        if (tag(r, &pos, end, &number, &wire) < 0)
            return -1;
        if (number == 1 || number == 2) {
            if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0)
                return -1;
            if (number == 1) {
                if (*key_start >= 0)
                    return unreadable(r, "map key twice");
                *key_start = pos;
                *key_stop = stop;
            } else {
                if (*value_start >= 0)
                    return unreadable(r, "map value twice");
                *value_start = pos;
                *value_stop = stop;
            }
            pos = stop;
        } else if (skip(r, wire, &pos, end) < 0) {
            return -1;
        }
    }
    if (*value_start < 0) {
        *value_start = end;
        *value_stop = end;
    }
    return 0;
}

/* A google.protobuf.Struct; with ``fields``, its fields go there (by key, last wins)
 * and the entries whose key's bytes are not in ``skipped`` are appended to
 * ``remainder`` (room for the whole struct) at *kept. */
static int struct_value(const Reader *r, Py_ssize_t pos, Py_ssize_t end, int depth,
                        PyObject *fields, char *remainder, Py_ssize_t *kept, PyObject *skipped) {
    if (depth > DEPTH)
        return unreadable(r, "depth");
    while (pos < end) {
        Py_ssize_t begin = pos, stop, key_start, key_stop, value_start, value_stop;
        uint32_t number;
        int wire;
        if (tag(r, &pos, end, &number, &wire) < 0)
            return -1;
        if (number != 1) {
            if (skip(r, wire, &pos, end) < 0)
                return -1;
            continue;
        }
        if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0)
            return -1;
        if (entry(r, pos, stop, &key_start, &key_stop, &value_start, &value_stop) < 0)
            return -1;
        if (key_start < 0)
            key_start = key_stop = stop; /* absent: the empty key */
        PyObject *key = text(r, key_start, key_stop);
        if (key == NULL)
            return -1;
        PyObject *value = value_of(r, value_start, value_stop, depth);
        if (value == NULL) {
            Py_DECREF(key);
            return -1;
        }
        int result = 0;
        if (fields != NULL) {
            result = PyDict_SetItem(fields, key, value);
            if (result == 0) {
                PyObject *raw =
                    PyBytes_FromStringAndSize((const char *)r->d + key_start, key_stop - key_start);
                int found = raw == NULL ? -1 : PySet_Contains(skipped, raw);
                Py_XDECREF(raw);
                if (found < 0) {
                    result = -1;
                } else if (!found) {
                    memcpy(remainder + *kept, r->d + begin, (size_t)(stop - begin));
                    *kept += stop - begin;
                }
            }
        }
        Py_DECREF(key);
        Py_DECREF(value);
        if (result < 0)
            return -1;
        pos = stop;
    }
    return 0;
}

/* The attributes' one group: its name, fields and remainder, each a new reference. */
static int attributes(const Reader *r, Py_ssize_t pos, Py_ssize_t end, PyObject *skipped,
                      PyObject **name, PyObject **fields, PyObject **remainder) {
    Py_ssize_t key_start, key_stop, value_start, value_stop;
    if (entry(r, pos, end, &key_start, &key_stop, &value_start, &value_stop) < 0)
        return -1;
    if (key_start < 0)
        key_start = key_stop = end;
    *name = text(r, key_start, key_stop);
    if (*name == NULL)
        return -1;
    *fields = PyDict_New();
    if (*fields == NULL)
        return -1;
    Py_ssize_t size = value_stop - value_start, kept = 0;
    char *buffer = PyMem_Malloc(size > 0 ? (size_t)size : 1);
    if (buffer == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int result = struct_value(r, value_start, value_stop, 0, *fields, buffer, &kept, skipped);
    if (result == 0) {
        *remainder = PyBytes_FromStringAndSize(buffer, kept);
        if (*remainder == NULL)
            result = -1;
    }
    PyMem_Free(buffer);
    return result;
}

/* The body's span of the message `data` as a read-only memoryview of it (wire.py's
   memoryview(data)[start:stop]): no copy; the view holds the message alive. */
static PyObject *body_view(PyObject *data, Py_ssize_t start, Py_ssize_t stop) {
    PyObject *whole = PyMemoryView_FromObject(data);
    if (whole == NULL)
        return NULL;
    PyObject *low = PyLong_FromSsize_t(start), *high = PyLong_FromSsize_t(stop);
    PyObject *span = NULL, *view = NULL;
    if (low != NULL && high != NULL) {
        span = PySlice_New(low, high, NULL);
        if (span != NULL)
            view = PyObject_GetItem(whole, span);
    }
    Py_XDECREF(low);
    Py_XDECREF(high);
    Py_XDECREF(span);
    Py_DECREF(whole);
    return view;
}

static PyObject *read_message(State *st, PyObject *data, const uint8_t *d, Py_ssize_t end,
                              PyObject *skipped) {
    Reader reader = {st, d};
    const Reader *r = &reader;
    Py_ssize_t pos = 0, body_start = 0, body_stop = 0;
    int kind = 0, eos = 0, observability = 0, has_config = 0;
    long modes[2] = {0, 0};
    PyObject *headers_list = PyList_New(0);
    PyObject *group = NULL, *fields = NULL, *remainder = NULL, *result = NULL;
    if (headers_list == NULL)
        return NULL;
    while (pos < end) {
        uint32_t number;
        int wire;
        Py_ssize_t stop;
        uint64_t value;
        if (tag(r, &pos, end, &number, &wire) < 0)
            goto done;
        if (number == 10) {
            if (expect(r, wire, 0) < 0 || varint(r, &pos, end, &value) < 0)
                goto done;
            observability = value != 0;
            continue;
        }
        if (!(number >= 2 && number <= 9) && number != 11) {
            if (skip(r, wire, &pos, end) < 0)
                goto done;
            continue;
        }
        if (expect(r, wire, 2) < 0 || length(r, &pos, end, &stop) < 0)
            goto done;
        if (number >= 2 && number <= 7) {
            if (kind) {
                unreadable(r, "request set twice");
                goto done;
            }
            kind = (int)number;
            if (number <= 3) {
                if (headers(r, pos, stop, headers_list, &eos) < 0)
                    goto done;
            } else if (number <= 5) {
                if (body(r, pos, stop, &body_start, &body_stop, &eos) < 0)
                    goto done;
            } else if (trailers(r, pos, stop) < 0) {
                goto done;
            }
        } else if (number == 9) {
            if (group != NULL) {
                unreadable(r, "attributes of two groups");
                goto done;
            }
            if (attributes(r, pos, stop, skipped, &group, &fields, &remainder) < 0)
                goto done;
        } else if (number == 11) {
            if (has_config) {
                unreadable(r, "protocol_config twice");
                goto done;
            }
            has_config = 1;
            if (config(r, pos, stop, modes) < 0)
                goto done;
        } else if (stop != pos) { /* metadata_context: skipped when empty */
            unreadable(r, "metadata_context");
            goto done;
        }
        pos = stop;
    }
    {
        PyObject *kind_name = st->kinds[kind == 0 ? 0 : kind - 1];
        PyObject *body_bytes = body_view(data, body_start, body_stop);
        PyObject *headers_tuple = PyList_AsTuple(headers_list);
        PyObject *config_value =
            has_config ? Py_BuildValue("(ll)", modes[0], modes[1]) : Py_NewRef(Py_None);
        if (fields == NULL)
            fields = PyDict_New();
        if (remainder == NULL)
            remainder = PyBytes_FromStringAndSize("", 0);
        if (body_bytes != NULL && headers_tuple != NULL && config_value != NULL &&
            fields != NULL && remainder != NULL) {
            result = PyObject_CallFunction(
                st->request, "OOOOOOOOO", kind_name, body_bytes, eos ? Py_True : Py_False,
                headers_tuple, observability ? Py_True : Py_False, config_value,
                group != NULL ? group : Py_None, fields, remainder);
        }
        Py_XDECREF(body_bytes);
        Py_XDECREF(headers_tuple);
        Py_XDECREF(config_value);
    }
done:
    Py_DECREF(headers_list);
    Py_XDECREF(group);
    Py_XDECREF(fields);
    Py_XDECREF(remainder);
    return result;
}

static PyObject *wire_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    State *st = PyModule_GetState(module);
    if (st == NULL)
        return NULL;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "read(data, skipped=frozenset())");
        return NULL;
    }
    PyObject *skipped = nargs == 2 ? args[1] : st->empty_set;
    if (!PyAnySet_Check(skipped)) {
        PyErr_SetString(PyExc_TypeError, "skipped must be a set or frozenset");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = read_message(st, args[0], (const uint8_t *)view.buf, view.len, skipped);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"read", (PyCFunction)(void (*)(void))wire_read, METH_FASTCALL,
     "wire.read, compiled: the fields the codec reads of a ProcessingRequest's bytes."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    State *st = PyModule_GetState(module);
    PyObject *wire = PyImport_ImportModule("ext_proc.edge.wire");
    if (wire == NULL)
        return -1;
    st->request = PyObject_GetAttrString(wire, "Request");
    st->unreadable = PyObject_GetAttrString(wire, "Unreadable");
    Py_DECREF(wire);
    if (st->request == NULL || st->unreadable == NULL)
        return -1;
    static const char *const kinds[] = {"",
                                        "request_headers",
                                        "response_headers",
                                        "request_body",
                                        "response_body",
                                        "request_trailers",
                                        "response_trailers"};
    /* kinds[0] is "", kinds[n - 1] the member of field n (2..7). */
    for (int i = 0; i < 7; i++) {
        st->kinds[i] = PyUnicode_InternFromString(kinds[i]);
        if (st->kinds[i] == NULL)
            return -1;
    }
    st->null_value = PyUnicode_InternFromString("null_value");
    st->number_value = PyUnicode_InternFromString("number_value");
    st->string_value = PyUnicode_InternFromString("string_value");
    st->bool_value = PyUnicode_InternFromString("bool_value");
    st->struct_value = PyUnicode_InternFromString("struct_value");
    st->list_value = PyUnicode_InternFromString("list_value");
    st->empty_set = PyFrozenSet_New(NULL);
    if (st->null_value == NULL || st->number_value == NULL || st->string_value == NULL ||
        st->bool_value == NULL || st->struct_value == NULL || st->list_value == NULL ||
        st->empty_set == NULL)
        return -1;
    return 0;
}

static int traverse(PyObject *module, visitproc visit, void *arg) {
    State *st = PyModule_GetState(module);
    if (st == NULL)
        return 0;
    Py_VISIT(st->request);
    Py_VISIT(st->unreadable);
    return 0;
}

static int clear(PyObject *module) {
    State *st = PyModule_GetState(module);
    if (st == NULL)
        return 0;
    Py_CLEAR(st->request);
    Py_CLEAR(st->unreadable);
    for (int i = 0; i < 8; i++)
        Py_CLEAR(st->kinds[i]);
    Py_CLEAR(st->null_value);
    Py_CLEAR(st->number_value);
    Py_CLEAR(st->string_value);
    Py_CLEAR(st->bool_value);
    Py_CLEAR(st->struct_value);
    Py_CLEAR(st->list_value);
    Py_CLEAR(st->empty_set);
    return 0;
}

static void free_module(void *module) { clear((PyObject *)module); }

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
    {0, NULL},
};

static struct PyModuleDef definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ext_proc.edge._wire",
    .m_doc = "The compiled twin of ext_proc.edge.wire.read.",
    .m_size = sizeof(State),
    .m_methods = methods,
    .m_slots = slots,
    .m_traverse = traverse,
    .m_clear = clear,
    .m_free = free_module,
};

PyMODINIT_FUNC PyInit__wire(void) { return PyModuleDef_Init(&definition); }
