"""Transfer buffers: every field survives pack/unpack bit for bit, whatever its dtype.

The seed system copied only float32 fields (atomic numbers arrived as zeros, float64
was truncated); here a message is raw bytes per field, so the round trip must be the
identity on the bit patterns -- NaN payloads, -0.0 and extreme integers included.
"""

from __future__ import annotations

import struct

import pytest
import torch

from alchemi_lit.core.errors import ConfigError
from alchemi_lit.core.state import Batch
from alchemi_lit.strategies.buffers import (
    ERROR_BYTES,
    FLAG_ABORT,
    FLAG_DONE,
    H_CREDIT_ATOMS,
    H_CREDIT_SYSTEMS,
    H_FLAGS,
    H_KIND,
    H_MAGIC,
    H_ROUND,
    KIND_CREDIT,
    KIND_DATA,
    MAGIC,
    BufferConfig,
    MessageLayout,
    schema_digest,
    schema_of,
    split_to_fit,
)

COUNTS = [3, 1, 5]  # atoms per system


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (compares NaN payloads and -0.0 exactly)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _nan_with_payload(dtype: torch.dtype, payload: int) -> torch.Tensor:
    if dtype == torch.float64:
        (x,) = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000000 | payload))
    else:
        (x,) = struct.unpack("<f", struct.pack("<I", 0x7F800000 | payload))
    t = torch.tensor([x], dtype=dtype)
    return t


def rich_batch(counts: list[int] = COUNTS, seed: int = 0) -> Batch:
    """A batch with fields of every dtype and tail shape a pipeline may carry."""
    g = torch.Generator().manual_seed(seed)
    n, b = sum(counts), len(counts)
    n_atoms = torch.tensor(counts, dtype=torch.int64)
    f64 = torch.randn(n, 3, generator=g, dtype=torch.float64)
    f64[0, 0] = -0.0
    f64[0, 1] = float("inf")
    f64[0, 2] = _nan_with_payload(torch.float64, 0xDEADBEEF)[0]
    f64[1, 0] = -float("inf")
    f64[1, 1] = 5e-324  # smallest subnormal
    f64[1, 2] = torch.finfo(torch.float64).max
    f32 = torch.randn(n, 2, generator=g, dtype=torch.float32)
    f32[0, 0] = -0.0
    f32[0, 1] = _nan_with_payload(torch.float32, 0x1234)[0]
    i64 = torch.randint(-(2**62), 2**62, (n,), generator=g, dtype=torch.int64)
    i64[0], i64[1] = torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max
    i32 = torch.randint(-(2**30), 2**30, (b, 4), generator=g, dtype=torch.int32)
    i32[0, 0], i32[0, 1] = torch.iinfo(torch.int32).min, torch.iinfo(torch.int32).max
    atom = {
        "positions": f64,
        "velocities": torch.randn(n, 3, generator=g, dtype=torch.float64),
        "forces": torch.randn(n, 3, generator=g, dtype=torch.float64),
        "masses": torch.rand(n, generator=g, dtype=torch.float64) + 1.0,
        "atomic_numbers": torch.tensor([18, 1, 118, 6, 8, 26, 29, 79, 92][:n], dtype=torch.int64),
        "fixed": torch.rand(n, generator=g) > 0.5,
        "aux_f32": f32,
        "aux_i64": i64,
        "aux_u8": torch.randint(0, 256, (n,), generator=g, dtype=torch.int64).to(torch.uint8),
        "system_idx": torch.repeat_interleave(torch.arange(b), n_atoms),
    }
    system = {
        "cell": torch.randn(b, 3, 3, generator=g, dtype=torch.float64),
        "pbc": torch.tensor([[True, False, True], [False, False, False], [True, True, True]]),
        "n_atoms": n_atoms,
        "system_id": torch.tensor([2**40, 0, -1], dtype=torch.int64),
        "energy": torch.tensor([-0.0, float("nan"), 1e300], dtype=torch.float64),
        "stage_steps": torch.randint(0, 1000, (b, 5), generator=g, dtype=torch.int64),
        "converged": torch.tensor([True, False, True]),
        "aux_i32": i32,
        "aux_f32_33": torch.randn(b, 3, 3, generator=g, dtype=torch.float32),
        "aux_u8_k": torch.randint(0, 256, (b, 7), generator=g, dtype=torch.int64).to(torch.uint8),
    }
    return Batch(atom, system)


def _roundtrip(batch: Batch, config: BufferConfig) -> tuple[MessageLayout, Batch]:
    layout = MessageLayout(schema_of(batch), config)
    buf = layout.new_buffer(torch.device("cpu"))
    buf.fill_(0xA5)  # garbage from a previous message must not leak into this one
    MessageLayout.write_header(
        buf, KIND_DATA, 0, 7, systems=batch.num_systems, atoms=batch.num_atoms
    )
    layout.pack(buf, batch)
    return layout, layout.unpack(buf, torch.device("cpu"))


def test_every_dtype_survives_bit_for_bit():
    batch = rich_batch()
    _, out = _roundtrip(batch, BufferConfig(num_systems=4, num_atoms=16))
    assert set(out.atom) == set(batch.atom)
    assert set(out.system) == set(batch.system)
    for store in ("atom", "system"):
        for name, src in getattr(batch, store).items():
            got = getattr(out, store)[name]
            assert got.dtype == src.dtype, name
            assert got.shape == src.shape, name
            assert torch.equal(_bits(got), _bits(src)), f"{name} changed in transit"
    # the special values really are there (and not silently normalised)
    assert torch.signbit(out.positions[0, 0]) and out.positions[0, 0] == 0
    assert torch.equal(
        _bits(out.positions[0, 2:3]), _bits(_nan_with_payload(torch.float64, 0xDEADBEEF))
    )
    assert int(out.aux_i64[0]) == torch.iinfo(torch.int64).min
    assert out.atomic_numbers.tolist() == batch.atomic_numbers.tolist()  # never zeros


def test_exact_capacity_and_leading_slice():
    """A batch filling the buffer exactly, and one system alone (offsets stay right)."""
    batch = rich_batch()
    _, out = _roundtrip(batch, BufferConfig(num_systems=3, num_atoms=9))
    assert torch.equal(_bits(out.positions), _bits(batch.positions))
    one = batch.select([2])
    _, out1 = _roundtrip(one, BufferConfig(num_systems=3, num_atoms=9))
    assert out1.num_systems == 1 and out1.num_atoms == 5
    for name in one.atom:
        assert torch.equal(_bits(out1.atom[name]), _bits(one.atom[name])), name
    assert out1.system_idx.tolist() == [0] * 5


def test_empty_message():
    batch = rich_batch()
    layout = MessageLayout(schema_of(batch), BufferConfig(num_systems=2, num_atoms=4))
    buf = layout.new_buffer(torch.device("cpu"))
    buf.fill_(0xFF)
    MessageLayout.write_header(buf, KIND_DATA, FLAG_DONE, 3, systems=0, atoms=0)
    empty = batch.select(torch.zeros(0, dtype=torch.long))
    layout.pack(buf, empty)
    out = layout.unpack(buf, torch.device("cpu"))
    assert out.num_systems == 0 and out.num_atoms == 0
    assert set(out.atom) == set(batch.atom) and set(out.system) == set(batch.system)
    h = MessageLayout.header(buf).tolist()
    assert h[H_MAGIC] == MAGIC and h[H_FLAGS] == FLAG_DONE and h[H_ROUND] == 3


def test_header_and_error_text_roundtrip():
    layout = MessageLayout(schema_of(rich_batch()), BufferConfig(num_systems=2, num_atoms=8))
    credit = layout.new_buffer(torch.device("cpu"), payload=False)
    assert credit.numel() == layout.header_bytes < layout.nbytes
    MessageLayout.write_header(credit, KIND_CREDIT, 0, -1, credit_atoms=123, credit_systems=2**40)
    h = MessageLayout.header(credit).tolist()
    assert (h[H_KIND], h[H_ROUND], h[H_CREDIT_ATOMS], h[H_CREDIT_SYSTEMS]) == (
        KIND_CREDIT,
        -1,
        123,
        2**40,
    )
    text = "RuntimeError: model exploded on system 17 — énergie ∞ (ünïcödé)"
    MessageLayout.write_header(credit, KIND_CREDIT, FLAG_ABORT, 4)
    MessageLayout.write_error(credit, 1, text)
    assert MessageLayout.read_error(credit) == (1, text)
    # a shorter error overwrites a longer one completely
    MessageLayout.write_error(credit, 2, "short")
    assert MessageLayout.read_error(credit) == (2, "short")
    # an over-long error text is cut to the error area, not written past it
    data = layout.new_buffer(torch.device("cpu"))
    data.fill_(0x5A)
    MessageLayout.write_header(data, KIND_DATA, FLAG_ABORT, 5)
    MessageLayout.write_error(data, 3, "x" * (ERROR_BYTES + 500))
    rank, got = MessageLayout.read_error(data)
    assert rank == 3 and got == "x" * ERROR_BYTES
    assert int(data[layout.header_bytes]) == 0x5A  # payload untouched


def test_capacity_overflow_rejected():
    batch = rich_batch()
    for config in (
        BufferConfig(num_systems=2, num_atoms=100),
        BufferConfig(num_systems=8, num_atoms=8),
    ):
        layout = MessageLayout(schema_of(batch), config)
        with pytest.raises(ValueError, match="does not fit"):
            layout.pack(layout.new_buffer(torch.device("cpu")), batch)


def test_split_to_fit():
    batch = rich_batch()  # 3, 1, 5 atoms
    assert split_to_fit(batch, BufferConfig(num_systems=8, num_atoms=9)) == 3
    assert split_to_fit(batch, BufferConfig(num_systems=8, num_atoms=8)) == 2
    assert split_to_fit(batch, BufferConfig(num_systems=1, num_atoms=100)) == 1
    assert split_to_fit(batch, BufferConfig(num_systems=8, num_atoms=2)) == 0
    assert split_to_fit(batch, BufferConfig(8, 100, num_edges=10), edges=[4, 6, 1]) == 2


def test_missing_field_on_this_rank_is_a_config_error():
    batch = rich_batch()
    layout = MessageLayout(schema_of(batch), BufferConfig(num_systems=4, num_atoms=16))
    batch.drop_field("aux_f32")
    with pytest.raises(ConfigError, match="aux_f32"):
        layout.pack(layout.new_buffer(torch.device("cpu")), batch)


def test_bad_config_and_digest():
    with pytest.raises(ConfigError):
        BufferConfig(num_systems=0)
    with pytest.raises(ConfigError):
        BufferConfig(num_atoms=0)
    with pytest.raises(ConfigError):
        BufferConfig(num_edges=-1)
    schema = schema_of(rich_batch())
    a = schema_digest(schema, BufferConfig(4, 16))
    assert a == schema_digest(schema_of(rich_batch(seed=1)), BufferConfig(4, 16))
    assert a != schema_digest(schema, BufferConfig(4, 17))
    other = rich_batch()
    other.atom["aux_f32"] = other.aux_f32.double()
    assert a != schema_digest(schema_of(other), BufferConfig(4, 16))


def test_info_roundtrip_only_for_the_systems_sent():
    import numpy as np

    batch = rich_batch()
    ids = batch.system_id.tolist()
    batch.info[ids[0]] = {"label": "first", "arr": np.arange(5)}
    batch.info[ids[2]] = {"error": "RuntimeError: boom"}
    batch.info[10**12] = {"label": "not in this batch"}
    _, out = _roundtrip(batch, BufferConfig(num_systems=4, num_atoms=16))
    assert set(out.info) == {ids[0], ids[2]}
    assert out.info[ids[0]]["label"] == "first"
    assert np.array_equal(out.info[ids[0]]["arr"], np.arange(5))
    assert out.info[ids[2]] == {"error": "RuntimeError: boom"}
    # a message without info leaves none behind from the previous one in the buffer
    plain = rich_batch()
    _, out = _roundtrip(plain, BufferConfig(num_systems=4, num_atoms=16))
    assert out.info == {}


def test_info_room_is_checked():
    from alchemi_lit.strategies.buffers import check_info_fits, info_size

    batch = rich_batch()
    batch.info[batch.system_id.tolist()[1]] = {"blob": "z" * 3000}
    config = BufferConfig(num_systems=4, num_atoms=16, info_bytes=1024)
    layout = MessageLayout(schema_of(batch), config)
    buf = layout.new_buffer(torch.device("cpu"))
    with pytest.raises(ValueError, match="info does not fit"):
        layout.pack(buf, batch)
    with pytest.raises(ConfigError, match=r"system 5 carries \d+ bytes of info.*raise info_bytes"):
        check_info_fits({"blob": "z" * 3000}, 5, config)
    assert check_info_fits(None, 5, config) == 0 == info_size({})
    assert 0 < check_info_fits({"a": 1}, 5, config) < 100
    with pytest.raises(ConfigError, match="info_bytes must be an integer >= 0"):
        BufferConfig(info_bytes=-1)


def test_buffer_config_is_a_public_name() -> None:
    import alchemi_lit as al

    assert al.BufferConfig is BufferConfig and "BufferConfig" in al.__all__
    assert al.BufferConfig(num_systems=8).num_systems == 8


# ------------------------------------------------------ what a rank sends and takes
def _argon(counts: list[int], first_id: int = 0) -> Batch:
    """Argon systems of 4 (fcc cell) or 32 (2x2x2) atoms, ids from ``first_id``."""
    from conftest import perturbed_argon

    atoms = [perturbed_argon(1, repeat={4: 1, 32: 2}[n], seed=k)[0] for k, n in enumerate(counts)]
    ids = list(range(first_id, first_id + len(counts)))
    return Batch.from_atoms(atoms, system_ids=ids, dtype=torch.float64)


def _rank_io(capacity: tuple[int, int], downs: list[int] = (), exit_code: int = 1):
    from types import SimpleNamespace

    from alchemi_lit.strategies.rank_io import Outbox, RankIO

    sim = SimpleNamespace(model=SimpleNamespace(cutoff=6.0, neighbors=SimpleNamespace(skin=0.0)))
    loop = SimpleNamespace(plan=SimpleNamespace(exit=exit_code))
    stats = SimpleNamespace(systems_in=0, peak_atoms=0, peak_systems=0)
    buffer = BufferConfig(num_systems=8, num_atoms=64)
    return RankIO(sim, loop, None, Outbox(), list(downs), buffer, capacity, stats, lambda: None)


def test_credit_counts_the_batch_inbox_and_outbox_of_a_rank():
    """The room a rank offers upstream is its capacity less everything it holds --
    stepping, received and waiting to go on -- split evenly between two upstream ranks
    with room for the largest system each.  (A rank that left its outbox out offered
    room it did not have: back-pressure never reached the source, and the pipeline
    tests' peak measure uses the same count, so they could not see it.)"""
    io = _rank_io(capacity=(400, 20), downs=[2])
    batch = _argon([4, 32])
    io.inbox.append(_argon([4], first_id=2))
    io.outbox.deliver(_argon([32, 4, 4], first_id=3))
    held_atoms, held_systems = 4 + 32 + 4 + 32 + 4 + 4, 6
    assert io.held(batch) == (held_atoms, held_systems)
    assert io.credit_shares(batch, [0], 0) == {0: (400 - held_atoms, 20 - held_systems)}
    free = (400 - held_atoms) // 2, (20 - held_systems) // 2  # 160 >= 64 atoms, 7 systems each
    assert io.credit_shares(batch, [0, 1], 0) == {0: free, 1: free}
    io.track_peak(batch)
    assert (io.stats.peak_atoms, io.stats.peak_systems) == (held_atoms, held_systems)


def test_quarantined_systems_received_pass_through_at_this_ranks_exit():
    """A system quarantined upstream is not simulated here: it goes straight on, at
    this rank's exit code (what the sink rank offsets into the pipeline-wide one) --
    not at the upstream rank's, which only coincides when both ranks have as many
    stages (every multi-rank test's plan had one stage a rank)."""
    from alchemi_lit.core.state import EXIT_MODEL_ERROR, EXIT_QUARANTINED

    io = _rank_io(capacity=(400, 20), exit_code=3)
    received = _argon([4, 4, 32, 4])
    received.status.fill_(1)  # the upstream rank's (one-stage) exit
    received.exit_code[1], received.exit_code[3] = EXIT_QUARANTINED, EXIT_MODEL_ERROR
    io.accept(received)
    through = io.outbox.batch
    assert through.system_id.tolist() == [1, 3] and through.status.tolist() == [3, 3]
    assert [b.system_id.tolist() for b in io.inbox] == [[0, 2]]
    assert io.inbox[0].status.tolist() == [1, 1]  # (the run loop admits them PENDING)
    assert io.stats.systems_in == 4


def test_a_system_waiting_for_credit_is_not_overtaken():
    """Routing keeps the outbox's order: while the first system waits for room
    downstream, smaller ones behind it wait too (else a stream of small systems could
    starve a large one); all go, in order, once the room is there."""
    io = _rank_io(capacity=(400, 20), downs=[1])
    io.outbox.deliver(_argon([4, 32, 4, 4]))
    sent = io.route({1: (20, 8)})  # room for the first 4 atoms, not for the 32 after
    assert [p.system_id.tolist() for p in sent.values()] == [[0]]
    assert io.outbox.batch.system_id.tolist() == [1, 2, 3]
    sent = io.route({1: (40, 8)})
    assert [p.system_id.tolist() for p in sent.values()] == [[1, 2, 3]]
    assert io.outbox.batch is None
