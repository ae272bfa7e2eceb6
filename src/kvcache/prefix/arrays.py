"""numpy views of numpy arrays and torch tensors, without importing torch.

The core of kvcache works on numpy and must not import torch (importing it
takes seconds and gigabytes that numpy users should not pay). A torch tensor
can only reach us from a caller that has imported torch already, so torch is
taken from ``sys.modules`` when one does. CPU tensors and numpy arrays share
memory both ways (``Tensor.numpy()``, ``torch.from_numpy``), so nothing here
copies. bfloat16 has no numpy dtype: such tensors are viewed as ``int16`` bit
patterns on the way in and reinterpreted on the way out.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..errors import InvalidArgument

_TORCH_DTYPE_NAMES = {
    "torch.float32": "float32",
    "torch.float16": "float16",
    "torch.bfloat16": "bfloat16",
}


def torch_dtype_name(dtype: object) -> str | None:
    """``float32``/``float16``/``bfloat16`` for those torch dtypes (a ``KVLayout``'s
    dtype), None for any other: the one place a torch dtype gets kvcache's name."""
    return _TORCH_DTYPE_NAMES.get(str(dtype))


def is_torch(value: object) -> bool:
    """Whether ``value`` is a torch tensor (checked without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def numpy_view(value: Any, what: str) -> tuple[np.ndarray, str | None]:
    """A numpy array sharing memory with ``value``, and its dtype's name if it is a float type.

    Args:
        value: a numpy array, a CPU torch tensor, or (for token ids) a list.
        what: how to name ``value`` in error messages.

    Returns:
        The array (``uint16`` bit patterns for a bfloat16 tensor) and one of
        ``float32``/``float16``/``bfloat16``, or None for other dtypes.

    Raises:
        InvalidArgument: a tensor on another device, or something that is no array.
    """
    if is_torch(value):
        if value.device.type != "cpu":
            raise InvalidArgument(f"{what} is on {value.device}: move it to the CPU first (.cpu())")
        name = torch_dtype_name(value.dtype)
        tensor = value.detach()
        if name == "bfloat16":
            tensor = tensor.view(sys.modules["torch"].int16)  # same bits, a dtype numpy knows
        return tensor.numpy().view(np.uint16) if name == "bfloat16" else tensor.numpy(), name
    if isinstance(value, np.ndarray):
        return value, value.dtype.name if value.dtype.name in ("float32", "float16") else None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} must be a numpy array or a torch tensor ({exc})") from None
    if array.dtype == object:
        raise InvalidArgument(
            f"{what} must be a numpy array or a torch tensor, not {type(value).__name__}"
        )
    return array, None


def like(template: Any, array: np.ndarray, dtype: str) -> Any:
    """``array`` as a torch tensor of ``dtype`` (sharing memory) if ``template`` is one."""
    if not is_torch(template):
        return array
    torch = sys.modules["torch"]
    if dtype == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)
