"""aligner.dump(..., wait=False): a full dump's files are written while the next step runs, and whatever reads the
dump (a reader in this process, aligner.wait_dumps, the process's exit) waits for them first."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest
import torch

import aligner
from aligner.core.errors import AlignerError
from aligner.dumping import directory, writer
from aligner.dumping.manifest import MANIFEST, Io, Kind, Record, iter_manifest
from aligner.dumping.read.source import load_tensor, read_source
from tests.support.twin_models import example_input, make_twins

ms.set_context(mode=ms.PYNATIVE_MODE)


def _torch_steps(directory_: Path, wait: bool, steps: int = 3) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    for step in range(steps):
        with aligner.dump(model, directory_, step=step, wait=wait):
            model(x).square().sum().backward()


def _records(path: Path) -> list[tuple]:
    """Every record of a dump with its data (a link resolved), as a reader sees it."""
    return [(it.record.seq, it.record.step, it.record.module, it.record.kind, it.record.io, it.record.index,
             it.record.same_as, it.record.stats, None if it.record.file is None and it.record.same_as is None
             else load_tensor(it).tobytes()) for it in read_source(path).items]


def test_a_dump_written_while_the_next_step_runs_reads_as_a_waited_one(tmp_path):
    """Same records, order, sequence numbers, statistics and bytes as the default dump of the same steps, read in
    the same process right after the last context (the reader waits for the writer)."""
    _torch_steps(tmp_path / "waited", True)
    _torch_steps(tmp_path / "overlapped", False)
    waited = _records(tmp_path / "waited")
    assert len(waited) == 51 and waited == _records(tmp_path / "overlapped")


def test_a_mindspore_dump_written_while_the_next_step_runs_reads_as_a_waited_one(tmp_path):
    """MindSpore's records wait for the context's exit (session.DEFER): handed to the writer there, written after."""
    x = ms.Tensor(example_input("cnn"))
    for name, wait in (("waited", True), ("overlapped", False)):
        _, mnet = make_twins("cnn")  # the same weights each time (BatchNorm's running statistics move per step)
        grad = ms.value_and_grad(lambda inp, net=mnet: net(inp).square().sum(), None, mnet.trainable_params())
        for step in range(2):
            with aligner.dump(mnet, tmp_path / name, step=step, wait=wait):
                grad(x)
    waited = _records(tmp_path / "waited")
    assert len(waited) > 40 and waited == _records(tmp_path / "overlapped")


@pytest.fixture
def held_writes(monkeypatch):
    """Tensor files wait until the returned event is set (the writer thread blocks in its first write)."""
    go = threading.Event()
    write = writer.DirectWriter.write

    def held(self, path, array):
        assert go.wait(30), "the test never let the writer go"
        write(self, path, array)
    monkeypatch.setattr(writer.DirectWriter, "write", held)
    yield go
    go.set()
    aligner.wait_dumps()


def test_the_context_exits_before_the_files_are_written_and_a_reader_waits_for_them(tmp_path, held_writes):
    _torch_steps(tmp_path / "d", False, steps=1)  # returns with the writer held in its first file
    lines = (tmp_path / "d" / MANIFEST).read_text().splitlines()
    assert len(lines) == 1  # the header alone: no record written yet
    threading.Timer(0.2, held_writes.set).start()
    assert len(read_source(tmp_path / "d").items) == 17  # read once the writer is done


def test_the_manifest_stays_locked_until_the_writer_is_done(tmp_path, held_writes):
    """Another process's overwrite=True must not delete records still being written: the lock outlives the context
    (a second open file description takes the lock the way another process would)."""
    _torch_steps(tmp_path / "d", False, steps=1)
    with pytest.raises(AlignerError, match="claimed by another dump"):
        directory._lock_manifest(tmp_path / "d", tmp_path / "d", None)
    held_writes.set()
    aligner.wait_dumps()
    fd = directory._lock_manifest(tmp_path / "d", tmp_path / "d", None)
    directory.os.close(fd)


def test_a_later_waited_step_writes_everything_before_its_exit_returns(tmp_path):
    """wait=True after wait=False steps waits for the earlier steps' records too, and lets the manifest go: the
    manifest on disk is then a waited dump's, line for line."""
    for name, waits in (("waited", (True, True, True)), ("d", (False, False, True))):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        for step, wait in enumerate(waits):
            with aligner.dump(model, tmp_path / name, step=step, wait=wait):
                model(torch.ones(3, 4)).sum().backward()
    lines = (tmp_path / "d" / MANIFEST).read_text().splitlines()
    assert len(lines) == 19 and lines[1:] == (tmp_path / "waited" / MANIFEST).read_text().splitlines()[1:]
    claimed = directory._claimed[(tmp_path / "d").resolve()]
    assert claimed.holders == 0 and claimed.fd is None and claimed.writer is None


def test_a_write_error_is_raised_once_by_a_later_context_or_wait_dumps(tmp_path, monkeypatch):
    def full(self, path, array):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(writer.DirectWriter, "write", full)
    with pytest.raises(AlignerError, match=r"writing dump .* failed: .*No space left on device"):
        _torch_steps(tmp_path / "d", False)
        aligner.wait_dumps()
    aligner.wait_dumps()  # raised once: nothing pending now
    claimed = directory._claimed[(tmp_path / "d").resolve()]
    assert claimed.holders == 0 and claimed.fd is None


def test_wait_must_be_a_bool(tmp_path):
    with pytest.raises(AlignerError, match="wait must be True or False, got 'no'"):
        aligner.dump(torch.nn.Linear(2, 2), tmp_path / "d", wait="no")


def _run(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter from the checkout (what the process's exit does is the point)."""
    root = Path(__file__).parents[2]
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=root, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_process_exit_waits_for_the_files(tmp_path):
    """A script that ends right after its last wait=False context leaves a complete dump (the exit waits)."""
    done = _run(f"""
        import torch, aligner
        from aligner.dumping import writer
        write = writer.DirectWriter.write
        def slow(self, path, array):
            import time; time.sleep(0.05)
            write(self, path, array)
        writer.DirectWriter.write = slow
        model = torch.nn.Linear(4, 2)
        with aligner.dump(model, {str(tmp_path / 'd')!r}, wait=False):
            model(torch.ones(3, 4)).sum().backward()
        """)
    assert done.returncode == 0, done.stderr
    assert len(read_source(tmp_path / "d").items) == 5


def test_a_write_error_at_the_process_exit_is_printed_in_one_line(tmp_path):
    done = _run(f"""
        import torch, aligner
        from aligner.dumping import writer
        def full(self, path, array):
            import time; time.sleep(0.3)  # fails after the context has exited
            raise OSError(28, "No space left on device")
        writer.DirectWriter.write = full
        model = torch.nn.Linear(4, 2)
        with aligner.dump(model, {str(tmp_path / 'd')!r}, wait=False):
            model(torch.ones(3, 4)).sum().backward()
        """)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aligner: writing dump") and "No space left" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_dump_contents_do_not_depend_on_the_writer_being_slower_than_the_step(tmp_path, monkeypatch):
    """Files slower than the steps: every step's tensors are still the step's own (host copies are taken before
    the context exits, so the next step's in-place updates cannot reach them)."""
    write = writer.DirectWriter.write

    def slow(self, path, array):
        time.sleep(0.01)
        write(self, path, array)
    monkeypatch.setattr(writer.DirectWriter, "write", slow)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    expected = []
    for step in range(4):
        with aligner.dump(model, tmp_path / "d", step=step, wait=False, params=True):
            expected.append(model[0].weight.detach().numpy().copy())
            opt.zero_grad()
            model(torch.ones(2, 4)).square().sum().backward()
            opt.step()  # in place, inside the context: the next step's parameters
    got = [np.load(tmp_path / "d" / rec.file) for _, rec in iter_manifest(tmp_path / "d")
           if getattr(rec, "kind", None) == "param" and rec.module == "0.weight"]
    assert len(got) == 4 and all(np.array_equal(a, b) for a, b in zip(got, expected))
    assert not np.array_equal(expected[0], expected[-1])  # the weights did move



def test_a_context_waits_for_a_writer_another_thread_is_finishing(tmp_path, monkeypatch):
    """A reader thread waiting for step 0's writer while the training thread opens step 1: step 1 must not start a
    second writer beside the first (its records would land before step 0's, or lines interleave); it waits."""
    go, first = threading.Event(), []
    write = writer.DirectWriter.write

    def held(self, path, array):  # only the first writer thread is held
        first.append(first[0] if first else threading.get_ident())
        if threading.get_ident() == first[0]:
            assert go.wait(30), "the test never let the writer go"
        write(self, path, array)
    monkeypatch.setattr(writer.DirectWriter, "write", held)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    with aligner.dump(model, tmp_path / "d", step=0, wait=False):
        model(torch.ones(3, 4)).sum().backward()
    reader = threading.Thread(target=aligner.wait_dumps)
    reader.start()
    for _ in range(200):  # until the reader has taken the writer over
        if not directory._claimed[(tmp_path / "d").resolve()].lent:
            break
        time.sleep(0.01)
    threading.Timer(0.3, go.set).start()
    with aligner.dump(model, tmp_path / "d", step=1):
        model(torch.ones(3, 4)).sum().backward()
    reader.join(30)
    seqs = [rec.seq for _, rec in list(iter_manifest(tmp_path / "d"))[1:]]
    assert len(seqs) == 12 and seqs == sorted(seqs)


def test_a_directory_removed_while_its_writer_is_held_starts_afresh(tmp_path, held_writes):
    """The user deleted the dump (shutil.rmtree) while step 0's files were still queued: the next context starts a
    new dump there, as after a waited step, and the lost records' write error has nowhere to go."""
    import shutil

    _torch_steps(tmp_path / "d", False, steps=1)
    shutil.rmtree(tmp_path / "d")
    held_writes.set()
    _torch_steps(tmp_path / "d", True, steps=1)
    _torch_steps(tmp_path / "ref", True, steps=1)  # the same step into a directory of its own
    lines = (tmp_path / "d" / MANIFEST).read_text().splitlines()
    assert len(lines) == 22 and lines[1:] == (tmp_path / "ref" / MANIFEST).read_text().splitlines()[1:]


def test_two_readers_both_wait_for_the_writer(tmp_path, held_writes):
    """The second of two reader threads also waits for the writer the first is already waiting for (it reads the
    dump complete, not what is on disk so far)."""
    _torch_steps(tmp_path / "d", False, steps=1)
    counts: list[int | str] = []

    def read() -> None:
        try:
            counts.append(len(read_source(tmp_path / "d").items))
        except AlignerError as exc:
            counts.append(str(exc))
    readers = [threading.Thread(target=read) for _ in range(2)]
    readers[0].start()
    for _ in range(200):  # until the first reader waits on the writer
        if not directory._claimed[(tmp_path / "d").resolve()].lent:
            break
        time.sleep(0.01)
    readers[1].start()
    threading.Timer(0.3, held_writes.set).start()
    for reader in readers:
        reader.join(30)
    assert counts == [17, 17]


def test_a_mindspore_tensor_changed_in_place_after_an_unwaited_exit_is_recorded_as_it_was(tmp_path, monkeypatch):
    """wait=False: the files are written after the context returns, so the flush hands the writer copies; a waited
    context lends it MindSpore's own memory instead (nothing runs before its files are written), which here would
    record the zeros written in place after the exit."""
    write = writer.DirectWriter.write

    def slow(self, path, array):
        time.sleep(0.02)
        write(self, path, array)
    monkeypatch.setattr(writer.DirectWriter, "write", slow)
    _, mnet = make_twins("cnn")
    with aligner.dump(mnet, tmp_path / "d", wait=False, backward=False):
        out = mnet(ms.Tensor(example_input("cnn")))
    expected = out.asnumpy().copy()
    out[:] = 0  # in place, while the writer is still writing
    assert not out.asnumpy().any() and expected.any()
    outputs = [rec for _, rec in iter_manifest(tmp_path / "d")
               if getattr(rec, "kind", None) == "forward" and rec.io == "output" and rec.file is not None]
    last = np.load(tmp_path / "d" / outputs[-1].file)  # the last leaf's output: the model's own
    assert np.array_equal(last, expected)


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "aligner-dump-writer"]


def test_one_writer_thread_serves_step_after_step_and_two_dumps_at_once(tmp_path):
    """A full dump's writer runs on a kept daemon thread (starting one cost ~0.25 ms a step): waited steps reuse it,
    and two dumps open at once each get their own, so neither waits for the other's close."""
    _torch_steps(tmp_path / "warm", True, steps=1)
    before = _writer_threads()
    _torch_steps(tmp_path / "a", True, steps=4)
    assert _writer_threads() == before and len(before) >= 1
    torch.manual_seed(0)
    m1, m2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    with aligner.dump(m1, tmp_path / "b1"), aligner.dump(m2, tmp_path / "b2"):
        (m1(torch.ones(2, 4)) + m2(torch.ones(2, 4))).sum().backward()
    assert len(read_source(tmp_path / "b1").items) == len(read_source(tmp_path / "b2").items) > 3
    assert len(_writer_threads()) <= max(len(before), 2)


def test_a_forked_child_closes_a_writer_it_inherited_without_waiting(tmp_path):
    """The writer threads are not in a forked child (a DataLoader worker forked inside a dump context): closing the
    inherited writer there returns instead of waiting for a thread that does not exist, and a new writer there gets
    a thread of its own, not one of the parent's idle ones."""
    import os

    (tmp_path / MANIFEST).touch()
    w = writer.BackgroundWriter(tmp_path, set())
    writer.BackgroundWriter(tmp_path, set()).close()  # its thread waits, idle, for the next writer
    time.sleep(0.2)  # (it turns idle just after the close returns)
    pid = os.fork()
    if pid == 0:  # the child: both closes must return
        try:
            w.close()
            writer.BackgroundWriter(tmp_path, set()).close()
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    w.close()
    assert done[0] == pid, "the child's close waited for a writer thread that is not in it"
    assert os.waitstatus_to_exitcode(done[1]) == 0


def _record(seq: int) -> Record:
    return Record(seq=seq, module="m", type="T", kind=Kind.FORWARD, io=Io.OUTPUT, index=0, dtype="float32",
                  shape=[seq + 1], step=0)


@pytest.mark.parametrize("cap", ["records", "bytes"])
def test_the_writer_queue_holds_at_most_its_caps_and_a_batch_over_them_passes_alone(tmp_path, held_writes, cap):
    """A flush hands its records as one batch (put_many): the writer still holds at most `max_records` records and
    `max_bytes` of host copies queued; a batch over a cap waits until nothing is queued, then goes alone."""
    (tmp_path / MANIFEST).write_text("")
    caps = {"max_records": 3, "max_bytes": 1 << 20} if cap == "records" else {"max_records": 100, "max_bytes": 8}
    w = writer.BackgroundWriter(tmp_path, set(), **caps)
    w.put_many([(_record(i), np.full(i + 1, i, np.float32)) for i in range(3)])  # over the bytes cap: alone
    blocked = threading.Thread(target=w.put, args=(_record(3), np.full(4, 3, np.float32)))
    blocked.start()
    blocked.join(0.5)
    assert blocked.is_alive()  # the first batch is still being written (held in its first file)
    held_writes.set()
    blocked.join(30)
    assert not blocked.is_alive()
    w.close()
    seqs = [e.seq for _, e in iter_manifest(tmp_path, settle=False) if not isinstance(e, (dict, ValueError))]
    assert seqs == [0, 1, 2, 3]


def test_a_ctrl_c_at_the_exit_still_closes_the_dump(tmp_path, monkeypatch):
    """A KeyboardInterrupt while a waited MindSpore context's exit reads its records (the flush) goes on up, and the
    context still closes its writer and lets the directory go (another process could claim it; the next step appends
    to it)."""
    from aligner.dumping import session

    x = ms.Tensor(example_input("cnn"))
    _, mnet = make_twins("cnn")
    grad = ms.value_and_grad(lambda inp: mnet(inp).square().sum(), None, mnet.trainable_params())
    with aligner.dump(mnet, tmp_path / "d", step=0):
        grad(x)
    real, calls = session.ms_views, []

    def interrupted():
        calls.append(1)
        raise KeyboardInterrupt
    monkeypatch.setattr(session, "ms_views", interrupted)
    with pytest.raises(KeyboardInterrupt):
        with aligner.dump(mnet, tmp_path / "d", step=1):
            grad(x)
    assert calls
    fd = directory._lock_manifest(tmp_path / "d", tmp_path / "d", None)  # let go: another process could claim it
    directory.os.close(fd)
    monkeypatch.setattr(session, "ms_views", real)
    with aligner.dump(mnet, tmp_path / "d", step=2):
        grad(x)
    steps = [it.record.step for it in read_source(tmp_path / "d").items]
    assert steps == sorted(steps) and set(steps) == {0, 2} and steps.count(0) == steps.count(2)
