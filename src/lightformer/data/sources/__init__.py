"""Where examples come from: a text corpus of files (``text``: ``TextSource``, read in bounded pieces by
``data.pieces``), the built-in offline corpora (``corpora``), image files (``image_files``), the Open Clip Art Library
(``openclipart``), emoji (``emoji``), printed lines in the declared typefaces (``rendering``); and what every source
checks (``check_one_source``)."""


def check_one_source(given: dict[str, bool], what: str) -> None:
    """Refuse a ``data.source`` that gives other than exactly one of its sources (``given``: whether each, by name, is
    set); ``what``: the kind of data and the sources the error lists."""
    named = [name for name, is_given in given.items() if is_given]
    if len(named) != 1:
        raise ValueError(f"data.source needs exactly one source of {what}; got {', '.join(named) if named else 'none'}")
