"""One module per practice; importing this package registers them all."""

from xlapipe.device_loader import DeviceLoader
from xlapipe.transforms.accumulate import accumulate_grad
from xlapipe.transforms.clip import clip_grad_norm
from xlapipe.transforms.compile_cache import with_compile_cache
from xlapipe.transforms.compile_step import compile_step
from xlapipe.transforms.default_dtype import set_default_tensor_type
from xlapipe.transforms.device import with_device
from xlapipe.transforms.ema import averaged_weights, ema, using_averaged_weights
from xlapipe.transforms.hf_masks import hf_traced_masks
from xlapipe.transforms.host_reads import no_host_reads
from xlapipe.transforms.loader_mp import wrap_loader_mp
from xlapipe.transforms.log_metrics import log_every
from xlapipe.transforms.matmul_precision import with_matmul_precision
from xlapipe.transforms.model_mp import wrap_model_mp
from xlapipe.transforms.precision import with_precision
from xlapipe.transforms.preemption import Preempted, checkpoint_on_preemption
from xlapipe.transforms.profile import profile
from xlapipe.transforms.recompile_guard import recompile_guard, unguarded
from xlapipe.transforms.scan_layers import scan_layers
from xlapipe.transforms.shard_data import shard_data
from xlapipe.transforms.static_shapes import static_shapes

__all__ = [
    "DeviceLoader",
    "Preempted",
    "accumulate_grad",
    "averaged_weights",
    "checkpoint_on_preemption",
    "clip_grad_norm",
    "compile_step",
    "ema",
    "hf_traced_masks",
    "log_every",
    "no_host_reads",
    "profile",
    "recompile_guard",
    "scan_layers",
    "set_default_tensor_type",
    "shard_data",
    "static_shapes",
    "unguarded",
    "using_averaged_weights",
    "with_compile_cache",
    "with_device",
    "with_matmul_precision",
    "with_precision",
    "wrap_loader_mp",
    "wrap_model_mp",
]
