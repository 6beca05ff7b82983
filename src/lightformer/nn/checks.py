"""Shape checks shared by the blocks and the tasks: errors that name the fields and suggest valid values.

Each check takes the names of its fields as the caller's user writes them: plain ``d_model`` for the
PyTorch modules, ``model.init_args.d_model`` for a task built from a LightningCLI config.
"""

from __future__ import annotations


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


def check_heads(d_model: int, n_heads: int, d_model_name: str = "d_model", n_heads_name: str = "n_heads") -> None:
    """Raise ValueError unless ``n_heads`` divides ``d_model`` (each head gets ``d_model / n_heads`` dimensions)."""
    if n_heads < 1:
        raise ValueError(f"{n_heads_name}={n_heads} must be at least 1")
    if d_model % n_heads:
        raise ValueError(
            f"{d_model_name}={d_model} is not divisible by {n_heads_name}={n_heads}: each head gets "
            f"d_model / n_heads dimensions; set {n_heads_name} to a divisor of {d_model} such as "
            f"{_either(nearest_divisors(d_model, n_heads))}, or {d_model_name} to a multiple of {n_heads} such as "
            f"{_either(nearest_multiples(d_model, n_heads))}"
        )


def check_patch_size(
    image_size: int,
    patch_size: int,
    image_size_name: str = "image_size",
    patch_size_name: str = "patch_size",
    resize_with: str | None = None,
) -> None:
    """Raise ValueError unless ``patch_size`` divides ``image_size`` (the patches must tile the image).

    ``resize_with`` names the setting that resizes the images, when there is one (the data module's).
    """
    if patch_size < 1:
        raise ValueError(f"{patch_size_name}={patch_size} must be at least 1")
    if image_size % patch_size:
        raise ValueError(
            f"{image_size_name}={image_size} is not a multiple of {patch_size_name}={patch_size}: the patches must "
            f"tile the image; set {patch_size_name} to a divisor of {image_size} such as "
            f"{_either(nearest_divisors(image_size, patch_size))}, or resize the images to a multiple of "
            f"{patch_size} such as {_either(nearest_multiples(image_size, patch_size))}"
            + (f" ({resize_with})" if resize_with else "")
        )
