"""Checks shared by the model configs and the blocks: errors that name the field, its value and what is valid.

Each check takes the name of its field as the user writes it (``d_model`` in a model config, ``lr`` in the
optimizer config); the command line adds where the field lives (``model.net.d_model``).
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


def check_at_least(name: str, value: float | None, minimum: float) -> None:
    """Raise ValueError unless ``value >= minimum`` (None passes: a size the data will fill in)."""
    if value is not None and value < minimum:
        raise ValueError(f"{name}={value} must be at least {minimum}")


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
    check_at_least("d_model", d_model, 1)
    check_at_least("n_heads", n_heads, 1)
    if d_model % n_heads:
        raise ValueError(
            f"d_model={d_model} is not divisible by n_heads={n_heads}: each head gets d_model / n_heads "
            f"dimensions; set n_heads to a divisor of {d_model} such as {_either(nearest_divisors(d_model, n_heads))}, "
            f"or d_model to a multiple of {n_heads} such as {_either(nearest_multiples(d_model, n_heads))}"
        )


def as_pair(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """An image or patch size as (height, width): a square's side twice, a (height, width) pair as it is."""
    if isinstance(size, int):
        return size, size
    if len(size) != 2:
        raise ValueError(f"a size is one integer (a square's side) or two (height, width); got {list(size)}")
    return int(size[0]), int(size[1])


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
    check_at_least("image_size", image_size, 1)
    check_at_least("patch_size", patch_size, 1)
    if image_size % patch_size:
        raise ValueError(
            f"image_size={image_size} is not a multiple of patch_size={patch_size}: the patches must tile the image; "
            f"set patch_size to a divisor of {image_size} such as {_either(nearest_divisors(image_size, patch_size))}, "
            f"or resize the images (the data's image_size) to a multiple of {patch_size} such as "
            f"{_either(nearest_multiples(image_size, patch_size))}"
        )
