"""Kernels travel to compile and measuring workers through ``autotuner.compile.cloudpickle_module``:
a kernel pickled by value (a closure, a decorated function, a notebook cell) must come back with the
file name TileLang's ``inspect`` reads its source from."""

from __future__ import annotations

import inspect

from autotuner.compile import cloudpickle_module


def _factory(scale: int):
    def kernel(x):  # a closure: cloudpickle ships it by value
        def body(y):  # nested code inside the closure's code
            return y * scale

        return body(x)

    return kernel


def test_a_function_pickled_by_value_keeps_its_file_and_its_source():
    kernel = _factory(3)
    pickler = cloudpickle_module()
    back = pickler.loads(pickler.dumps(kernel))
    assert back is not kernel and back(2) == 6
    assert back.__code__.co_filename == __file__  # cloudpickle 3.1.3 alone writes "<dynamic-code>"
    nested = [c for c in back.__code__.co_consts if inspect.iscode(c)]
    assert nested and all(c.co_filename == __file__ for c in nested)
    assert "def body(y)" in inspect.getsource(back)


def test_other_objects_pickle_as_cloudpickle_pickles_them():
    pickler = cloudpickle_module()
    value = {"a": [1, 2.5, "x"], "f": len, "lam": lambda v: v + 1}
    back = pickler.loads(pickler.dumps(value))
    assert back["a"] == value["a"] and back["f"] is len and back["lam"](1) == 2
