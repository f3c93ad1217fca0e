"""The one contract every membership-inference attack implements, and the name -> class registry.

An attack is a frozen dataclass whose fields are its parameters. ``attack.score(inputs)`` maps the signals
in an :class:`AttackInputs` to one score per queried example, and **every score is "higher = member"**:
thresholding it from above yields the attack's ROC. Signals are scaled logits ``phi`` (see
:mod:`attacks.signals`), one column per augmented query.

:func:`leave_one_out` runs an attack the way the LiRA paper evaluates it (Carlini et al. 2022, Sec. V): each
of ``M`` models trained on random halves is the target in turn and the other ``M - 1`` are its references.

>>> sorted(available_attacks())[:3]
['attack_p', 'calibrated_loss', 'lira_offline']
>>> rng = np.random.default_rng(0)
>>> inputs = AttackInputs(target=rng.normal(size=(5, 2)))
>>> build_attack("loss").score(inputs).shape
(5,)
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np

from foundation.errors import UserError

__all__ = [
    "AttackInputs",
    "Attack",
    "register_attack",
    "available_attacks",
    "get_attack_class",
    "build_attack",
    "ATTACK_SPECS",
    "attack_names",
    "configured_attack",
    "needs_reference",
    "LeaveOneOutResult",
    "leave_one_out",
]


def _as_float(name: str, value: Any, ndim: int, *, allow_1d: bool = False) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype not in (np.float32, np.float64):      # float32 signals stay float32 (half the memory)
        arr = arr.astype(np.float64)
    if allow_1d and arr.ndim == ndim - 1:
        arr = arr[..., None]
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D; got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN; signals must be numbers (scaled logits are always finite)")
    return arr


def _as_mask(name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype != np.bool_:
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name} must be boolean (or 0/1); got values outside {{0, 1}}")
        arr = arr.astype(bool)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {arr.shape}")
    return arr


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class AttackInputs:
    """Everything an attack may look at, as arrays of scaled logits ``phi``.

    Shapes: ``n`` queried examples, ``A`` augmentations per query, ``K`` reference models, ``m`` population
    samples. Inputs are converted to float64 / bool copies; 1-D ``target`` (``A = 1``) is accepted.

    Attributes:
        target: ``(n, A)`` phi of the audited (target) model on the queried examples.
        reference: ``(K, n, A)`` phi of the reference (shadow) models on the same examples, or None.
        reference_in: ``(K, n)`` keep masks: True where the example was in that reference model's training
            set. None means "unknown"; offline attacks then treat every reference as OUT.
        labels: ``(n,)`` class labels (for per-class analyses; no attack here requires them), or None.
        pop_target: ``(m, A)`` phi of the target on population samples ``z`` known to be OUT of the target.
        pop_reference: ``(K, m, A)`` phi of the same reference models on ``z``.
        pop_reference_in: ``(K, m)`` keep masks of ``z`` in the references; None means ``z`` is OUT of every
            reference (fresh population data, the usual case).

    Raises:
        ValueError: when shapes disagree, a mask is not boolean, a signal is NaN, or a ``pop_*``/``*_in``
            array is given without the array it qualifies.
    """

    target: np.ndarray
    reference: np.ndarray | None = None
    reference_in: np.ndarray | None = None
    labels: np.ndarray | None = None
    pop_target: np.ndarray | None = None
    pop_reference: np.ndarray | None = None
    pop_reference_in: np.ndarray | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        target = _as_float("target", self.target, 2, allow_1d=True)
        n, a = target.shape
        put("target", target)
        if self.reference is not None:
            ref = _as_float("reference", self.reference, 3, allow_1d=True)
            if ref.shape[1:] != (n, a):
                raise ValueError(f"reference must have shape (K, {n}, {a}) to match target; got {ref.shape}")
            put("reference", ref)
        if self.reference_in is not None:
            if self.reference is None:
                raise ValueError("reference_in was given without reference")
            put("reference_in", _as_mask("reference_in", self.reference_in, self.reference.shape[:2]))
        if self.labels is not None:
            labels = np.asarray(self.labels)
            if labels.shape != (n,):
                raise ValueError(f"labels must have shape ({n},); got {labels.shape}")
            put("labels", labels)
        if self.pop_target is not None:
            pop = _as_float("pop_target", self.pop_target, 2, allow_1d=True)
            if pop.shape[1] != a:
                raise ValueError(f"pop_target must have {a} augmentation columns like target; got {pop.shape}")
            put("pop_target", pop)
        if self.pop_reference is not None:
            if self.pop_target is None or self.reference is None:
                raise ValueError("pop_reference needs pop_target and reference")
            pref = _as_float("pop_reference", self.pop_reference, 3, allow_1d=True)
            want = (self.reference.shape[0], *self.pop_target.shape)
            if pref.shape != want:
                raise ValueError(f"pop_reference must have shape {want}; got {pref.shape}")
            put("pop_reference", pref)
        if self.pop_reference_in is not None:
            if self.pop_reference is None:
                raise ValueError("pop_reference_in was given without pop_reference")
            put("pop_reference_in",
                _as_mask("pop_reference_in", self.pop_reference_in, self.pop_reference.shape[:2]))

    @property
    def n(self) -> int:
        """Number of queried examples."""
        return self.target.shape[0]

    @property
    def n_augmentations(self) -> int:
        """Number of augmented queries per example, ``A``."""
        return self.target.shape[1]

    @property
    def n_reference(self) -> int:
        """Number of reference models ``K`` (0 when none)."""
        return 0 if self.reference is None else self.reference.shape[0]

    def out_mask(self) -> np.ndarray:
        """``(K, n)`` True where a reference is OUT for an example (all True when keep masks are unknown)."""
        if self.reference is None:
            raise ValueError("out_mask needs reference signals")
        if self.reference_in is None:
            return np.ones(self.reference.shape[:2], dtype=bool)
        return ~self.reference_in


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attack(abc.ABC):
    """Base class: a membership-inference attack with its parameters as frozen fields.

    Subclasses set the class variables ``name`` (via :func:`register_attack`), ``needs_reference`` and
    ``online`` (True if the attack needs reference models trained WITH each queried example), validate their
    fields in ``__post_init__`` and implement :meth:`score_with_info`. ``needs_keep_masks`` marks attacks that
    cannot run without ``reference_in``.
    """

    name: ClassVar[str] = ""
    needs_reference: ClassVar[bool] = False
    online: ClassVar[bool] = False
    needs_keep_masks: ClassVar[bool] = False

    def score(self, inputs: AttackInputs) -> np.ndarray:
        """Membership scores ``(n,)`` float64, higher = member."""
        return self.score_with_info(inputs)[0]

    @abc.abstractmethod
    def score_with_info(self, inputs: AttackInputs) -> tuple[np.ndarray, dict[str, Any]]:
        """Scores ``(n,)`` (higher = member) plus JSON-ready diagnostics (fallback counts, sizes)."""

    def params(self) -> dict[str, Any]:
        """The attack's parameters as a JSON-ready dict."""
        return dataclasses.asdict(self)

    def _check(self, inputs: AttackInputs) -> None:
        if not isinstance(inputs, AttackInputs):
            raise TypeError(f"inputs must be an AttackInputs; got {type(inputs).__name__}")
        if self.needs_reference and inputs.n_reference == 0:
            raise UserError(f"attack {self.name!r} needs reference models; train some shadow models first")
        if self.needs_keep_masks and inputs.reference_in is None:
            raise UserError(f"attack {self.name!r} needs the reference keep masks (reference_in); "
                            f"pass them or use an offline attack")


_REGISTRY: dict[str, type[Attack]] = {}
_A = TypeVar("_A", bound=type[Attack])
_BUILTIN_MODULES = ("attacks.baselines", "attacks.lira", "attacks.rmia")


def _load_builtins() -> None:
    """Import the modules that register the built-in attacks (idempotent; avoids an import cycle)."""
    for module in _BUILTIN_MODULES:
        importlib.import_module(module)


def register_attack(name: str) -> Callable[[_A], _A]:
    """Class decorator: register an :class:`Attack` subclass under ``name``.

    Raises:
        ValueError: if ``name`` is empty or already registered, or the class is not an Attack.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"attack name must be a non-empty string; got {name!r}")

    def deco(cls: _A) -> _A:
        if not (isinstance(cls, type) and issubclass(cls, Attack)):
            raise ValueError(f"only Attack subclasses can be registered; got {cls!r}")
        if name in _REGISTRY:
            raise ValueError(f"attack {name!r} is already registered (by {_REGISTRY[name].__qualname__})")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def available_attacks() -> tuple[str, ...]:
    """Registered attack names, in registration order."""
    _load_builtins()
    return tuple(_REGISTRY)


def get_attack_class(name: str) -> type[Attack]:
    """The class registered under ``name``.

    Raises:
        UserError: (a ValueError) for an unknown name; the message lists the valid names.
    """
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown attack {name!r}; valid attacks: {', '.join(sorted(_REGISTRY))}") from None


def build_attack(name: str, **params: Any) -> Attack:
    """Instantiate the attack ``name`` with ``params``.

    Raises:
        UserError: (a ValueError) for an unknown attack or parameter name; lists the valid ones.
    """
    cls = get_attack_class(name)
    valid = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise UserError(f"attack {name!r} has no parameter(s) {', '.join(unknown)}; "
                        f"valid: {', '.join(valid) or '(none)'}")
    return cls(**params)


#: Every attack a config or ``attack.json`` may name -> (registered class name, fixed parameters). The one list
#: of attack names: :class:`attacks.config.AttackConfig`, ``epsilon.attack`` and the gate policy read it.
ATTACK_SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "loss": ("loss", {}),
    "attack_p": ("attack_p", {}),
    "calibrated_loss": ("calibrated_loss", {}),
    "lira_online": ("lira_online", {"fix_variance": False}),
    "lira_online_fixed_var": ("lira_online", {"fix_variance": True}),
    "lira_offline": ("lira_offline", {"fix_variance": False}),
    "lira_offline_fixed_var": ("lira_offline", {"fix_variance": True}),
    "rmia_online": ("rmia_online", {}),
    "rmia_offline": ("rmia_offline", {}),
}


def attack_names() -> tuple[str, ...]:
    """Every attack name a config may list, in the order attacks run and are reported.

    >>> attack_names()[:3]
    ('loss', 'attack_p', 'calibrated_loss')
    """
    return tuple(ATTACK_SPECS)


def configured_attack(name: str, *, gamma: float = 1.0, offline_a: float | str = "auto",
                      ties: str = "likelihood_ratio", lira_location: str = "median") -> Attack:
    """The registry attack behind a config name, with its parameters (RMIA: ``gamma``, offline ``a``, ``ties``;
    LiRA: ``location``, the median by default as in the LiRA paper's code).

    >>> configured_attack("lira_online_fixed_var").params()["fix_variance"]
    True
    >>> configured_attack("lira_offline").params()["location"], configured_attack("rmia_offline").params()["a"]
    ('median', 'auto')
    """
    if name not in ATTACK_SPECS:
        raise UserError(f"unknown attack {name!r}; valid: {', '.join(ATTACK_SPECS)}")
    registry_name, params = ATTACK_SPECS[name]
    if registry_name.startswith("rmia_"):
        params = {**params, "gamma": float(gamma), "ties": ties}
    if registry_name == "rmia_offline":
        params = {**params, "a": offline_a if offline_a == "auto" else float(offline_a)}
    if registry_name.startswith("lira_"):
        params = {**params, "location": lira_location}
    return build_attack(registry_name, **params)


def needs_reference(name: str) -> bool:
    """Whether the config attack ``name`` needs reference models.

    >>> needs_reference("loss"), needs_reference("lira_online")
    (False, True)
    """
    if name not in ATTACK_SPECS:
        raise UserError(f"unknown attack {name!r}; valid: {', '.join(ATTACK_SPECS)}")
    return get_attack_class(ATTACK_SPECS[name][0]).needs_reference


class LeaveOneOutResult(NamedTuple):
    """Scores of one leave-one-out round (one target model) and the target's true membership."""

    scores: np.ndarray
    membership: np.ndarray


def leave_one_out(
    attack: Attack,
    phi_all: np.ndarray,
    keep: np.ndarray,
    labels: np.ndarray | None = None,
    *,
    pop_phi: np.ndarray | None = None,
    pop_keep: np.ndarray | None = None,
    targets: Sequence[int] | None = None,
) -> list[LeaveOneOutResult]:
    """Attack each model in turn, using the others as references (LiRA paper's evaluation protocol).

    Args:
        attack: any registered attack.
        phi_all: ``(M, n, A)`` scaled logits of ``M`` models on the ``n`` pool examples (``(M, n)`` is read
            as ``A = 1``).
        keep: ``(M, n)`` bool, True where the example was in that model's training set.
        labels: optional ``(n,)`` class labels, passed through.
        pop_phi: optional ``(M, m, A)`` phi of the same models on population samples OUT of every target.
        pop_keep: optional ``(M, m)`` keep masks of the population samples (None: OUT of every model).
        targets: which model indices to attack (default: all ``M``).

    Returns:
        One :class:`LeaveOneOutResult` ``(scores, membership)`` per target, in the order of ``targets``
        (default ``0..M-1``), where ``membership = keep[target]`` is the ground truth for ``scores``.

    Raises:
        ValueError: on inconsistent shapes, ``M < 2`` or a target index out of range.

    >>> rng = np.random.default_rng(0)
    >>> keep = rng.random((4, 50)) < 0.5
    >>> phi = rng.normal(size=(4, 50, 1)) + 3.0 * keep[..., None]
    >>> res = leave_one_out(build_attack("loss"), phi, keep)
    >>> len(res), res[0].scores.shape, bool((res[2].membership == keep[2]).all())
    (4, (50,), True)
    """
    phi_all = _as_float("phi_all", phi_all, 3, allow_1d=True)
    m_models, n, _ = phi_all.shape
    if m_models < 2:
        raise ValueError(f"leave_one_out needs at least 2 models; got M={m_models}")
    keep = _as_mask("keep", keep, (m_models, n))
    if pop_phi is not None:
        pop_phi = _as_float("pop_phi", pop_phi, 3, allow_1d=True)
        if pop_phi.shape[0] != m_models:
            raise ValueError(f"pop_phi must have M={m_models} models first; got shape {pop_phi.shape}")
        if pop_keep is not None:
            pop_keep = _as_mask("pop_keep", pop_keep, pop_phi.shape[:2])
    elif pop_keep is not None:
        raise ValueError("pop_keep was given without pop_phi")
    indices = range(m_models) if targets is None else list(targets)
    out = []
    for t in indices:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < m_models:
            raise ValueError(f"targets must be model indices in [0, {m_models}); got {t!r}")
        others = np.arange(m_models) != t
        inputs = AttackInputs(
            target=phi_all[t],
            reference=phi_all[others],
            reference_in=keep[others],
            labels=labels,
            pop_target=None if pop_phi is None else pop_phi[t],
            pop_reference=None if pop_phi is None else pop_phi[others],
            pop_reference_in=None if pop_keep is None else pop_keep[others],
        )
        out.append(LeaveOneOutResult(attack.score(inputs), keep[t].copy()))
    return out
