"""``build_model``: from a :class:`training.config.ModelConfig` to a DP-ready :class:`ImageClassifier`.

Steps, each recorded in :attr:`BuiltModel.notes`:

1. Create the network: a registry name (``small_cnn``, ``mlp``, ``resnet20_cifar``), any timm architecture
   (random weights, small-image defaults, see :mod:`training.models.timm_models`), or
   ``package.module:factory`` (called with ``num_classes=`` when it accepts it, then its output is checked).
   An import path runs code (importing the module runs its top level; then the factory is called), so it is
   refused unless the caller passes ``trust_code=True`` (see :func:`names_code`); registry and timm names
   run no code from the config. timm's ``hf-hub:``/``local-dir:`` names are refused always (no downloads).
2. Load ``model.pretrained`` (a local file, never a download) strictly into the network, *before* the
   BatchNorm fix when the file has BatchNorm statistics (affine weights carry over to GroupNorm) and before
   the ViT token move when it uses timm's names; our own ``model.safetensors`` (``net.``-prefixed) loads after.
3. With ``fix_batchnorm``, replace every BatchNorm by GroupNorm (:func:`replace_batchnorm`).
4. Make the network safe for Opacus's hooks (:func:`make_opacus_safe`: no in-place updates, contiguous
   convolution inputs); for timm ViTs, move ``cls_token``/``reg_token``/``pos_embed`` into a leaf module
   so Opacus gives them per-sample gradients (:mod:`training.models.vit_tokens`); freeze parameters whose
   per-sample gradients Opacus would get wrong or miss (:func:`freeze_functorch_unsafe`).
5. Wrap in :class:`ImageClassifier` (normalisation inside), run it once on a tiny batch to check the input
   size, the number of outputs and that ``forward_head(forward_features(x))`` equals the network's output.
6. Freeze parameters matching ``model.freeze``; report what Opacus would reject (:func:`dp_issues`).

>>> from training.config import ModelConfig
>>> built = build_model(ModelConfig(arch="small_cnn"), num_classes=10, input_shape=(3, 8, 8), seed=0)
>>> type(built.module).__name__, built.frozen, count_parameters(built.module)
('ImageClassifier', [], (24346, 24346))
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from training.config import ModelConfig
from foundation.errors import CheckpointError, ConfigError, UntrustedCodeError
from training.models.classifier import ImageClassifier, has_timm_protocol
from training.models.opacus_compat import make_opacus_safe
from training.models.dp_compat import (
    apply_freeze,
    dp_issues,
    freeze_functorch_unsafe,
    frozen_parameters,
    replace_batchnorm,
)
from training.models.cifar_resnet import depth_mismatch
from training.models.registry import MODELS
from training.models.timm_models import create_timm_model, is_timm_model
from training.models.vit_tokens import can_patch_vit_tokens, patch_vit_tokens
from training.models.weights import key_mismatch, load_state_strict, load_weights_file, strip_prefix

__all__ = ["BuiltModel", "build_model", "count_parameters", "create_network", "names_code", "unwrap_model", "TIMM_SOURCES"]

#: timm's model-source prefixes (``hf-hub:org/name``, ``local-dir:/path``): they fetch configs and weights.
TIMM_SOURCES = ("hf-hub", "local-dir")


@dataclass
class BuiltModel:
    """A built model and what was done to it.

    Attributes:
        module: the :class:`ImageClassifier` (training mode, on CPU).
        notes: one line per change or caveat (stem changes, BatchNorm → GroupNorm, loaded weights, ...).
        frozen: names of parameters with ``requires_grad=False`` (from ``model.freeze`` or forced).
    """

    module: nn.Module
    notes: list[str] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)


def count_parameters(module: nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts, each shared parameter counted once.

    >>> count_parameters(nn.Linear(3, 2))
    (8, 8)
    """
    params = list(module.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Seed torch's CPU generator inside the block only (the caller's global RNG state is restored)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


#: How OpacusAuditor records a model of the user's own class (``user-model/<module>.<class>``): weights only.
USER_MODEL_PREFIX = "user-model/"


_DDP_NAMES = ("DistributedDataParallel", "DPDDP", "DifferentiallyPrivateDistributedDataParallel")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside Opacus's wrappers (``GradSampleModule*``) and DDP/DPDDP."""
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(model, "_module") and isinstance(model._module, nn.Module):
            model = model._module
        elif type(model).__name__ in _DDP_NAMES and isinstance(getattr(model, "module", None), nn.Module):
            model = model.module
        else:
            break
    return model


def user_model_refusal(arch: str) -> str:
    """The one line for a command that needs to rebuild a model recorded as the user's own class.

    >>> user_model_refusal("user-model/my.Net")[:60]
    "model.arch 'user-model/my.Net' is your own model class, reco"
    """
    return (f"model.arch {arch!r} is your own model class, recorded by OpacusAuditor with its weights only: "
            f"dp-audit cannot rebuild it, so audit attack and audit transfer cannot run on this run; its "
            f"evidence is its canaries (audit epsilon RUN, audit report RUN)")


def names_code(arch: str) -> bool:
    """Whether building ``model.arch`` would import and call code named by it (an import path).

    >>> names_code("small_cnn"), names_code("resnet18.a1_in1k"), names_code("os:system")
    (False, False, True)
    """
    return ":" in str(arch)


def _check_import_path(arch: str, *, trust_code: bool) -> None:
    """Refuse timm hub/folder names always and import paths unless ``trust_code`` (before any import)."""
    source = arch.partition(":")[0].strip().lower().replace("_", "-")  # timm reads hf_hub: as hf-hub: too
    if source in TIMM_SOURCES:
        raise ConfigError(f"model.arch {arch!r} asks timm to fetch a model from {source}; dp-audit never downloads: "
                          f"give the timm name (e.g. 'resnet18') and a local weights file in model.pretrained")
    if not trust_code:
        raise UntrustedCodeError(f"model.arch = {arch!r} names code to import; refusing to run it. Pass "
                                 f"trust_code=True (--trust-code) only if you trust whoever wrote this config")


def _import_factory(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"model.arch {path!r}: an import path must look like 'package.module:factory'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"model.arch {path!r}: cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"model.arch {path!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"model.arch {path!r}: {attr!r} is not callable")
    return obj


def _call_factory(path: str, num_classes: int, kwargs: dict[str, Any]) -> tuple[nn.Module, list[str]]:
    factory = _import_factory(path)
    try:
        params = inspect.signature(factory).parameters
        takes_classes = "num_classes" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    except (TypeError, ValueError):  # builtins without a signature
        takes_classes = True
    try:
        try:
            net = factory(num_classes=num_classes, **kwargs) if takes_classes else factory(**kwargs)
        except TypeError as exc:
            if not takes_classes or "num_classes" not in str(exc):
                raise
            net, takes_classes = factory(**kwargs), False  # the factory rejects num_classes after all
    except TypeError as exc:
        raise ConfigError(f"model.arch {path!r} rejected model.kwargs {kwargs} ({exc})") from None
    if not isinstance(net, nn.Module):
        raise ConfigError(f"model.arch {path!r} returned {type(net).__name__}, not a torch.nn.Module")
    classes = f"num_classes={num_classes}, " if takes_classes else ""
    return net, [f"built by {path}({classes}**{kwargs}); output size checked against num_classes"]


def _last_linear(net: nn.Module, input_shape: tuple[int, int, int]) -> str:
    """Name of the nn.Linear whose output *is* the network's output (found by running it once)."""
    outputs: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(lambda _m, _i, out, name=name: outputs.__setitem__(name, out))
               for name, m in net.named_modules() if isinstance(m, nn.Linear)]
    was_training = net.training
    try:
        net.eval()
        with torch.no_grad():
            out = net(torch.zeros(2, *input_shape))
    except Exception as exc:
        raise ConfigError(f"the model cannot run on input {input_shape} ({' '.join(str(exc).split())[:200]})") \
            from None
    finally:
        net.train(was_training)
        for h in handles:
            h.remove()
    for name, value in outputs.items():
        if value is out:
            return name
    raise ConfigError("the factory's network must end in an nn.Linear (its output is the logits) or offer "
                      "timm's forward_features/forward_head/get_classifier/reset_classifier")


#: Most parameters a model may have (10^10 float32 = 40 GB): counted on the meta device before any allocation, so
#: a config or received manifest asking for ``channels: [100000, 100000]`` is refused in one line.
MAX_MODEL_PARAMETERS = 10**10


def _check_size(build: Any, *, arch: str, kwargs: dict[str, Any]) -> None:
    """Build once on the meta device (no memory) and refuse more than :data:`MAX_MODEL_PARAMETERS`."""
    try:
        with torch.device("meta"):
            probe = build()
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"model.kwargs for {arch!r} are invalid: {exc}") from None
    except (RuntimeError, NotImplementedError, AttributeError):
        return  # a model that cannot be built on the meta device: its real build is the check
    n = sum(p.numel() for p in probe.parameters())
    if n > MAX_MODEL_PARAMETERS:
        raise ConfigError(f"model {arch!r} with kwargs {kwargs} would have {n:.3g} parameters, more than "
                          f"{MAX_MODEL_PARAMETERS:.0e} ({n * 4 / 2**30:.3g} GiB of float32): refusing to allocate it")


def create_network(cfg: ModelConfig, *, num_classes: int, input_shape: tuple[int, int, int],
                   trust_code: bool = False) -> tuple[nn.Module, str | None, list[str]]:
    """Step 1 of :func:`build_model`: (network, head_name or None for timm's protocol, notes).

    ``trust_code``: allow an import-path ``cfg.arch`` (see :func:`build_model`). A registry or timm model is
    first built on the meta device and refused above :data:`MAX_MODEL_PARAMETERS`.
    """
    arch, kwargs = cfg.arch, dict(cfg.kwargs)
    if arch in MODELS:
        allowed = MODELS.allowed_kwargs(arch)
        bad = sorted(set(kwargs) - set(allowed))
        if bad:
            raise ConfigError(f"model.kwargs {bad} are not accepted by {arch!r}; allowed: {allowed}")
        _check_size(lambda: MODELS.get(arch)(num_classes=num_classes, input_shape=input_shape, **kwargs),
                    arch=arch, kwargs=kwargs)
        try:
            net = MODELS.get(arch)(num_classes=num_classes, input_shape=input_shape, **kwargs)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"model.kwargs for {arch!r} are invalid: {exc}") from None
        return net, None, []
    if names_code(arch):
        _check_import_path(arch, trust_code=trust_code)
        net, notes = _call_factory(arch, num_classes, kwargs)
        if not has_timm_protocol(net):
            return net, _last_linear(net, input_shape), notes
    elif is_timm_model(arch):
        _check_size(lambda: create_timm_model(arch, num_classes=num_classes, input_shape=input_shape, kwargs=kwargs,
                                              cifar_stem=cfg.cifar_stem)[0], arch=arch, kwargs=kwargs)
        net, notes = create_timm_model(arch, num_classes=num_classes, input_shape=input_shape, kwargs=kwargs,
                                       cifar_stem=cfg.cifar_stem)
    elif arch.startswith(USER_MODEL_PREFIX):
        raise ConfigError(user_model_refusal(arch))
    else:
        raise ConfigError(f"unknown model.arch {arch!r}: use one of {', '.join(MODELS.names())}, any timm model "
                          f"name (e.g. 'resnet18', 'vit_tiny_patch16_224'), or an import path "
                          f"'package.module:factory'")
    if not isinstance(net.get_classifier(), nn.Module):
        raise ConfigError(f"model {arch!r} has several classifier heads (e.g. a distillation head); use a "
                          f"single-head variant")
    return net, None, notes


def _check_runs(model: ImageClassifier, *, arch: str, num_classes: int, input_shape: tuple[int, int, int]) -> None:
    """Run the wrapped model once on two random images and check shapes and the feature/head split."""
    x = torch.rand(2, *input_shape, generator=torch.Generator().manual_seed(0))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            direct = model.net(model.normalize(x))
            feats = model.forward_features(x)
            logits = model.forward_head(feats)
    except Exception as exc:
        raise ConfigError(f"model {arch!r} cannot run on input (C, H, W) = {input_shape} "
                          f"({' '.join(str(exc).split())[:300]}); check model.kwargs (e.g. img_size) or the "
                          f"image size") from None
    finally:
        model.train(was_training)
    if not isinstance(direct, torch.Tensor) or tuple(direct.shape) != (2, num_classes):
        shape = tuple(direct.shape) if isinstance(direct, torch.Tensor) else type(direct).__name__
        raise ConfigError(f"model {arch!r} returns {shape} for 2 images, expected (2, {num_classes}) logits")
    if feats.ndim != 2:
        raise ConfigError(f"model {arch!r}: pooled features have shape {tuple(feats.shape)}, expected (N, D)")
    if not torch.allclose(logits, direct, rtol=1e-4, atol=1e-5):
        raise ConfigError(f"model {arch!r}: forward_head(forward_features(x)) differs from the network's output; "
                          f"its classifier is not a final linear layer on pooled features")


def build_model(cfg: ModelConfig, *, num_classes: int, input_shape: tuple[int, int, int],
                seed: int | None = None, trust_code: bool = False) -> BuiltModel:
    """Build the model described by ``cfg`` (see the module docstring for the steps).

    Args:
        cfg: architecture, kwargs, local pretrained file, DP fixes, freezing and input normalisation.
        num_classes: number of logits.
        input_shape: (C, H, W) of the float input in [0, 1].
        seed: seeds the random initialisation (inside this call only; torch's global RNG is restored);
            None uses the current global RNG.
        trust_code: allow ``cfg.arch`` to be an import path ``package.module:factory``, which imports the
            module and calls the factory. Pass True only for configs the user wrote (``audit train``), never
            for one read from a run directory someone else made, unless the user said so (``--trust-code``).

    Returns:
        :class:`BuiltModel` with the module in training mode.

    Raises:
        UntrustedCodeError: ``cfg.arch`` is an import path and ``trust_code`` is False (nothing was imported).
        ConfigError: unknown architecture, bad kwargs or normalisation, a model that cannot take the input,
            or a ``freeze`` pattern matching nothing.
        CheckpointError: the pretrained file is missing, corrupt or does not match the network.
        ValueError: ``num_classes`` or ``input_shape`` out of range (a programming error).
    """
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    if len(input_shape) != 3 or any(int(s) < 1 for s in input_shape) or int(input_shape[0]) not in (1, 3):
        raise ValueError(f"input_shape must be (C, H, W) with C in (1, 3) and H, W >= 1, got {input_shape!r}")
    input_shape = tuple(int(s) for s in input_shape)  # type: ignore[assignment]
    mean, std = cfg.normalize_mean, cfg.normalize_std
    if (mean is None) != (std is None):
        raise ConfigError("set both model.normalize_mean and model.normalize_std, or neither")
    if std is not None and min(std) <= 0:
        raise ConfigError(f"model.normalize_std must be > 0 in every channel, got {tuple(std)}")
    if mean is not None and input_shape[0] != len(mean):
        raise ConfigError(f"model.normalize_mean has {len(mean)} channels but the input has {input_shape[0]}")

    with _seeded(seed):
        net, head_name, notes = create_network(cfg, num_classes=num_classes, input_shape=input_shape,
                                               trust_code=trust_code)
        state = load_weights_file(cfg.pretrained) if cfg.pretrained else None
        if state is not None:
            state = strip_prefix(state, "net.")  # our own model.safetensors files
        head_prefix = head_name or _protocol_head_name(net)
        hint = "; for ImageNet weights set model.cifar_stem=false" if cfg.cifar_stem else ""
        loaded = False
        wrong_depth = None if state is None else depth_mismatch(net, state, arch=cfg.arch, flag="model.arch")
        if wrong_depth:
            raise CheckpointError(f"{cfg.pretrained}: {wrong_depth}")
        if state is not None and key_mismatch(net, state) == ([], []):
            notes += load_state_strict(net, state, source=str(cfg.pretrained), head_prefix=head_prefix, hint=hint)
            loaded = True
        if cfg.fix_batchnorm:
            bn_notes = replace_batchnorm(net, prefix="net")
            if loaded and bn_notes:
                notes.append("pretrained BatchNorm weight/bias carried over to GroupNorm; running statistics dropped")
            notes += bn_notes
        notes += make_opacus_safe(net)
        if can_patch_vit_tokens(net):
            notes += [n.replace("into token_embed", "into net.token_embed") for n in patch_vit_tokens(net)]
        if state is not None and not loaded:
            notes += load_state_strict(net, state, source=str(cfg.pretrained), head_prefix=head_prefix, hint=hint)
        notes += freeze_functorch_unsafe(net, root_is_called=head_name is not None)
        model = ImageClassifier(net, mean=mean, std=std, head_name=head_name)
        _check_runs(model, arch=cfg.arch, num_classes=num_classes, input_shape=input_shape)
    if mean is not None:
        notes.append(f"input normalised inside the model: mean={tuple(mean)}, std={tuple(std)}")
    apply_freeze(model, cfg.freeze)
    frozen = frozen_parameters(model)
    if cfg.freeze:
        notes.append(f"frozen by model.freeze {list(cfg.freeze)}: {len(frozen)} parameter tensor(s)")
    notes += dp_issues(model)
    model.train()
    return BuiltModel(module=model, notes=notes, frozen=frozen)


def _protocol_head_name(net: nn.Module) -> str | None:
    if not has_timm_protocol(net):
        return None
    head = net.get_classifier()
    return next((name for name, m in net.named_modules() if m is head), None)

