"""The map-style training loaders resume mid-epoch exactly: ``ResumableDataLoader`` saves how many batches of the
epoch were handed out, and a loader given that state yields the rest of the epoch, then the next epochs, without
reading the skipped examples."""

import gc
import weakref

import pytest
import torch
from lightning.fabric.utilities.distributed import DistributedSamplerWrapper
from torch.utils.data import Dataset

from lightformer.data.loading.sampling import EpochShuffleSampler, ResumableDataLoader, TokenBudgetBatchSampler


class Numbers(Dataset):
    """Item i is i; remembers which items were read (in this process)."""

    def __init__(self, size: int) -> None:
        self.size, self.read = size, []

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> int:
        self.read.append(index)
        return index


LENGTHS = [(7 * i) % 13 + 1 for i in range(40)]


def make_loader(form: str, workers: int, dataset: Dataset | None = None) -> ResumableDataLoader:
    """A loader of the 40 numbers, by a shuffled batch size (this rank's shard of two when ``form`` is "ddp", as
    Lightning wraps the sampler) or by a token budget over LENGTHS."""
    dataset = dataset or Numbers(len(LENGTHS))
    options = {"num_workers": workers, "persistent_workers": workers > 0, "collate_fn": list}
    if form == "budget":
        batches = TokenBudgetBatchSampler(LENGTHS, max_tokens=24, shuffle=True, seed=3)
        return ResumableDataLoader(dataset, batch_sampler=batches, **options)
    sampler = EpochShuffleSampler(len(dataset), seed=3)
    if form == "ddp":
        sampler = DistributedSamplerWrapper(sampler, num_replicas=2, rank=1, shuffle=False)
    return ResumableDataLoader(dataset, batch_size=3, sampler=sampler, drop_last=True, **options)


def epoch(loader: ResumableDataLoader, number: int, stop: int | None = None) -> list[list[int]]:
    """The batches of epoch ``number`` (Lightning calls set_epoch on the sampler, or the batch sampler's), the first
    ``stop`` of them if given."""
    (loader.batch_sampler if loader.batch_size is None else loader.sampler).set_epoch(number)
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == stop:
            break
    return batches


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("form", ["batch_size", "ddp", "budget"])
def test_a_restored_loader_yields_the_rest_of_the_epoch_then_the_next_epochs(form, workers):
    reference = make_loader(form, 0)
    epochs = [epoch(reference, number) for number in range(3)]
    assert epochs[1] != epochs[2] and len(epochs[1]) > 5

    interrupted = make_loader(form, workers)
    epoch(interrupted, 0)
    assert epoch(interrupted, 1, stop=4) == epochs[1][:4]
    state = interrupted.state_dict()
    assert state == {"epoch": 1, "batches": 4}

    resumed = make_loader(form, workers)
    resumed.load_state_dict(state)
    assert len(resumed) == len(epochs[1])  # Lightning counts the epoch's batches from the saved number on
    assert epoch(resumed, 1) == epochs[1][4:]
    assert resumed.state_dict() == {"epoch": 1, "batches": len(epochs[1])}
    assert epoch(resumed, 2) == epochs[2]


def test_the_skipped_batches_are_not_read_and_the_global_generator_moves_as_in_the_run_resumed():
    dataset = Numbers(len(LENGTHS))
    resumed = make_loader("batch_size", 0, dataset)
    resumed.load_state_dict({"epoch": 0, "batches": 4})
    before = torch.get_rng_state()
    batches = epoch(resumed, 0)
    assert torch.equal(torch.get_rng_state(), before)  # the interrupted run drew its base seed at the epoch's start
    assert sorted(dataset.read) == sorted(index for batch in batches for index in batch)
    assert len(dataset.read) == (len(LENGTHS) // 3 - 4) * 3

    fresh = make_loader("batch_size", 0)
    epoch(fresh, 0)
    assert not torch.equal(torch.get_rng_state(), before)


def test_a_state_saved_at_an_epochs_end_resumes_at_the_next_epochs_first_batch():
    reference = make_loader("budget", 0)
    first, second = epoch(reference, 0), epoch(reference, 1)
    assert reference.state_dict() == {"epoch": 1, "batches": len(second)}

    finished = make_loader("budget", 0)
    epoch(finished, 0)
    resumed = make_loader("budget", 0)
    resumed.load_state_dict(finished.state_dict())
    assert epoch(resumed, 1) == second
    again = make_loader("budget", 0)
    again.load_state_dict(finished.state_dict())
    assert epoch(again, 0) == first  # the same epoch, done: nothing left to skip into


def test_a_dropped_loader_is_freed_at_once_with_its_workers():
    """No reference cycle keeps a loader (and its persistent workers) alive until the garbage collector runs: there,
    shutting the workers down waits seconds for each."""
    loader = make_loader("budget", 2)
    epoch(loader, 0, stop=4)
    workers = loader._iterator._workers
    freed = weakref.ref(loader)
    gc.disable()
    try:
        del loader
        assert freed() is None, "a reference cycle holds the loader"
    finally:
        gc.enable()
    for worker in workers:
        worker.join(timeout=10)
        assert not worker.is_alive()
