"""Prepared data in an object store (``data.prepare.dir: s3://...``), against a local S3 server (moto): the job's rank
0 prepares and uploads it, a node that did not prepare it mirrors its small files and streams the shards from the
store, and the windows read there are the ones read where it was prepared."""

import boto3
import litdata.streaming.downloader
import numpy as np
import pytest
from moto.server import ThreadedMotoServer

from lightformer.data.loading.streaming import EvaluationWindows, LoaderConfig, training_loader
from lightformer.data.preparation import prepare as prepare_module
from lightformer.data.preparation.prepare import PrepareConfig, TokenizerConfig, prepare_text
from lightformer.data.sources.text import TextSource

TEXT = "".join(f"Sentence {i} of a corpus kept in a bucket, {i * 7919 % 1000} words long.\n" for i in range(400))


@pytest.fixture
def bucket(monkeypatch):
    """A bucket "corpora" on a local S3 server, which boto3 and LitData reach through the environment."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for name, value in {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    # The server speaks plain HTTP, which LitData's obstore client refuses unless told (a real store speaks HTTPS).
    monkeypatch.setitem(litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS, "allow_http", "true")
    client = boto3.client("s3")
    client.create_bucket(Bucket="corpora")
    yield client
    server.stop()


def test_a_corpus_prepared_into_an_object_store_streams_on_a_node_that_did_not_prepare_it(
    tmp_path, bucket, monkeypatch
):
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    source = TextSource(train_files=[str(tmp_path / "corpus.txt")], val_fraction=0.1)
    tokenizer = TokenizerConfig(kind="char")
    url = "s3://corpora/prepared"
    prepared = prepare_text(source, tokenizer, PrepareConfig(dir=url, cache_dir=str(tmp_path / "node0"), num_workers=1))

    keys = [item["Key"] for item in bucket.list_objects_v2(Bucket="corpora")["Contents"]]
    name = prepared.folder.name
    assert f"prepared/{name}/prepared.json" in keys and f"prepared/{name}/tokenizer.json" in keys
    assert any(key.startswith(f"prepared/{name}/train/chunk-") for key in keys)
    assert not list((tmp_path / "node0").glob(".*")), "the uploaded manifest's temporary file is left behind"

    # Another node: an empty cache, not the job's rank 0; it must not prepare, only mirror and stream.
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setattr(prepare_module, "_prepare_text", lambda *a, **k: pytest.fail("a second node prepared"))
    node1 = tmp_path / "node1"
    mirrored = prepare_text(source, tokenizer, PrepareConfig(dir=url, cache_dir=str(node1)))
    assert mirrored.folder == node1 / name
    assert not list(node1.rglob("*.bin")), "the shards are read from the store, not copied with the small files"
    assert mirrored.tokenizer.to_str() == prepared.tokenizer.to_str()
    assert mirrored.split_dir("train").url == f"{url}/{name}/train"

    for split in ("train", "val"):
        here, there = EvaluationWindows(prepared.split_dir(split), 16), EvaluationWindows(mirrored.split_dir(split), 16)
        assert len(here) == len(there) > 0
        for i in (0, len(here) // 2, len(here) - 1):
            np.testing.assert_array_equal(here[i][0], there[i][0])
    batches = training_loader(mirrored.split_dir("train"), 16, LoaderConfig(batch_size=4), seed=0)
    streamed = sum(len(x) for x, _ in batches)
    assert streamed == 4 * (len(EvaluationWindows(prepared.split_dir("train"), 16)) // 4)


@pytest.mark.parametrize(
    ("environment", "prepares"),
    [
        ({}, True),  # one process, or Lightning's launcher before it starts the others
        ({"RANK": "0"}, True),
        ({"RANK": "3", "LOCAL_RANK": "0"}, False),  # torchrun: node 1's first process
        ({"SLURM_PROCID": "2"}, False),
        ({"NODE_RANK": "1"}, False),  # Lightning's launcher on a second node
        ({"NODE_RANK": "0", "LOCAL_RANK": "1"}, False),
    ],
)
def test_only_the_jobs_rank_zero_prepares_into_an_object_store(monkeypatch, environment, prepares):
    for name in ("RANK", "SLURM_PROCID", "NODE_RANK", "GROUP_RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert prepare_module._job_rank_zero() is prepares


def test_a_store_litdata_cannot_write_is_refused_by_name():
    with pytest.raises(ValueError, match=r"data.prepare.dir='https://example.com/data'.*s3://, gs://, r2://"):
        PrepareConfig(dir="https://example.com/data")
