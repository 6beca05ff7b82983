"""Checks shared by the model and data configs and the blocks: errors that name the field, its value and what is
valid.

Each check takes the name of its field as the user writes it (``d_model`` in a model config, ``lr`` in the
optimizer config); the command line adds where the field lives (``model.net.d_model``). The data configs give the
whole path themselves (``data.loader.batch_size``).
"""

from __future__ import annotations

from collections.abc import Iterable


def nearest_divisors(n: int, k: int) -> list[int]:
    """The divisors of ``n`` nearest ``k``: the largest one below ``k`` and the smallest one above it."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    below = [d for d in divisors if d < k]
    above = [d for d in divisors if d > k]
    return ([below[-1]] if below else []) + ([above[0]] if above else [])


def nearest_multiples(n: int, k: int) -> list[int]:
    """The positive multiples of ``k`` nearest ``n``: the largest one below ``n`` and the smallest one above."""
    below = n // k * k
    return ([below] if below > 0 else []) + [below + k]


def _either(values: list[int]) -> str:
    return " or ".join(map(str, values))


def _check_divides(whole_name: str, whole: int, part_name: str, part: int, problem: str, whole_fix: str) -> None:
    """Raise ValueError unless both are positive and ``part`` divides ``whole``: the ``problem``, then the nearest
    values of ``part`` that would do, or of ``whole`` (``whole_fix`` says how to change it)."""
    check_at_least(whole_name, whole, 1)
    check_at_least(part_name, part, 1)
    if whole % part:
        raise ValueError(
            f"{problem}; set {part_name} to a divisor of {whole} such as {_either(nearest_divisors(whole, part))}, "
            f"or {whole_fix} to a multiple of {part} such as {_either(nearest_multiples(whole, part))}"
        )


def check_at_least(name: str, value: float | None, minimum: float) -> None:
    """Raise ValueError unless ``value >= minimum`` (None passes: a size the data will fill in)."""
    if value is not None and value < minimum:
        raise ValueError(f"{name}={value} must be at least {minimum}")


def check_set(config: object, *names: str) -> None:
    """Raise ValueError unless the fields ``names`` of a model config are set (the sizes a task fills in)."""
    for name in names:
        if getattr(config, name) is None:
            raise ValueError(f"{type(config).__name__}.{name} is not set: a task fills it from the data's facts")


def check_fraction(name: str, value: float, upper_inclusive: bool = False) -> None:
    """Raise ValueError unless ``0 <= value < 1`` (``<= 1`` with ``upper_inclusive``): a rate or probability."""
    if not (0 <= value <= 1 if upper_inclusive else 0 <= value < 1):
        raise ValueError(f"{name}={value} must be in [0, 1{']' if upper_inclusive else ')'}")


def check_choice(name: str, value: object, choices: Iterable[object]) -> None:
    """Raise ValueError unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; valid: {', '.join(map(repr, choices))}")


def check_heads(d_model: int, n_heads: int) -> None:
    """Raise ValueError unless ``n_heads`` divides ``d_model`` (each head gets ``d_model / n_heads`` dimensions)."""
    problem = f"d_model={d_model} is not divisible by n_heads={n_heads}: each head gets d_model / n_heads dimensions"
    _check_divides("d_model", d_model, "n_heads", n_heads, problem, "d_model")


def check_kv_heads(n_heads: int, n_kv_heads: int | None, name: str = "n_kv_heads") -> None:
    """Refuse key/value heads that do not divide the query heads (grouped-query attention shares each among a group)."""
    if n_kv_heads is not None and (isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1
                                   or n_heads % n_kv_heads):  # fmt: skip
        raise ValueError(f"{name}={n_kv_heads!r} must divide n_heads={n_heads} (grouped-query attention shares each "
                         "key/value head among n_heads / n_kv_heads query heads)")  # fmt: skip


def as_pair(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """An image or patch size as (height, width): a square's side twice, a (height, width) pair as it is."""
    if isinstance(size, int):
        return size, size
    if len(size) != 2:
        raise ValueError(f"a size is one integer (a square's side) or two (height, width); got {list(size)}")
    return int(size[0]), int(size[1])


def lists_as_pairs(config: object, *names: str) -> None:
    """Store the sizes ``names`` of a frozen dataclass given as lists (YAML and checkpoints give lists) as tuples."""
    for name in names:
        if isinstance(getattr(config, name), list):
            object.__setattr__(config, name, as_pair(getattr(config, name)))


def check_patch_size(image_size: int | tuple[int, int], patch_size: int | tuple[int, int]) -> None:
    """Raise ValueError unless ``patch_size`` divides ``image_size`` (the patches must tile the image), either a
    square's side or (height, width) each."""
    if not (isinstance(image_size, int) and isinstance(patch_size, int)):
        for axis, image, patch in zip(("height", "width"), as_pair(image_size), as_pair(patch_size), strict=True):
            try:
                check_patch_size(image, patch)
            except ValueError as error:
                raise ValueError(f"the {axis}s: {error}") from None
        return
    problem = f"image_size={image_size} is not a multiple of patch_size={patch_size}: the patches must tile the image"
    fix = "resize the images (the data's image_size)"
    _check_divides("image_size", image_size, "patch_size", patch_size, problem, fix)
