"""``DataModule``: what every lightformer data module is to the rest of the framework."""

from __future__ import annotations

import lightning as L

from lightformer.data.preparation.caching import SameDataOnResume
from lightformer.facts import DataFacts


class DataModule(SameDataOnResume, L.LightningDataModule):
    """A ``LightningDataModule`` that tells its task what the model needs to know about the data through one typed
    method, ``data_facts`` (``lightformer.facts.DataFacts``), and whose prepared data goes with every checkpoint
    (``SameDataOnResume``). The tasks read nothing else from it."""

    prepared: object = None  # the prepared folder (or an object with its ``folder``); None: nothing prepared
    validates_on_a_subset = False  # whether ``fit`` validates on part of the validation split (``cli.after_fit``)

    def data_facts(self) -> DataFacts:
        """What the model needs to know about this data, once it is prepared (preparing it on first use)."""
        raise NotImplementedError(f"{type(self).__name__} does not say what its data is (data_facts)")
