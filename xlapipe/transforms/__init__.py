"""One module per practice; importing this package registers them all."""
from xlapipe.transforms.default_dtype import set_default_tensor_type
from xlapipe.transforms.device import with_device
from xlapipe.transforms.loader_mp import DeviceLoader, wrap_loader_mp
from xlapipe.transforms.model_mp import wrap_model_mp
from xlapipe.transforms.precision import with_precision

__all__ = [
    "DeviceLoader",
    "set_default_tensor_type",
    "with_device",
    "with_precision",
    "wrap_loader_mp",
    "wrap_model_mp",
]
