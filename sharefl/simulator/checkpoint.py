"""Checkpoints of a running loop: its state after a round, restored into a fresh build.

**Argument.** Every loop is built by a deterministic function of its
:class:`~sharefl.simulator.config.RunConfig`: the data, partitions and model come from
:func:`~sharefl.simulator.federated.setup.build_setup` (pure), every generator is seeded from the
run's seed. So the loop after round t is its freshly built self plus what the rounds
changed, and a round can change state in only three ways: rebind an attribute or a
container's slot (``self.w = ...``, ``list.append``), modify a tensor or array in place
(``momentum.mul_``), or advance a generator. :class:`LoopState` records the object graph
reachable from the loop right after it is built (:meth:`LoopState.__init__`: the
*baseline*, each object named by its path of attributes and keys) and a checkpoint holds,
for every baseline object, what those three ways can have changed:

- objects with a ``__dict__`` and baseline lists and dicts: their contents;
- baseline tensors whose version counter moved and baseline arrays whose bytes changed:
  their values (unchanged ones, the datasets above all, are not written);
- torch, numpy and :mod:`random` generators: their states;
- everything created after the build: by value (pickled);
- the process's global generators (torch's, CUDA's, numpy's, :mod:`random`'s), which no
  loop draws from today (the models' dropout draws from the loop's training generator,
  :class:`~sharefl.simulator.models.GeneratorDropout`) but a plain ``nn.Dropout`` would.

Inside those contents a baseline object is written as its path. :meth:`LoopState.restore`
resolves each path in a freshly built loop of the same configuration and puts the contents
back *in place*, so every alias of an object (a generator the server shares with the
loop, a closure over a module) sees the restored state. Functions, classes, modules and
other objects that hold no state are taken from the fresh build. An object outside those
kinds that the build made cannot be captured safely: :class:`CheckpointError` names it.

The claim "a resumed run is the uninterrupted run" is tested bit for bit for each loop
(tests/test_sim_checkpoint.py). A checkpoint is a pickle: load only checkpoints your own
runs wrote.

Files: ``checkpoint.pkl`` in the run's folder, written atomically
(:func:`~sharefl.simulator.results.write_atomically`) with the run id, the round and the
elapsed seconds beside the state (:class:`LoopCheckpoint`).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import io
import pickle
import random
import types
from collections import deque
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sharefl.simulator.config import run_key_of
from sharefl.simulator.errors import SimulatorError
from sharefl.simulator.results import write_atomically

CHECKPOINT_FILE = "checkpoint.pkl"
FORMAT = 1

Path_ = tuple[Hashable, ...]  # attribute names (str) and ("key", k) steps from the loop

# Objects that hold no state a round can change: taken from the fresh build by path.
_STATELESS: tuple[type, ...] = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.BuiltinMethodType,
    types.ModuleType,
    functools.partial,
    type,
    torch.dtype,
    torch.device,
    torch.Size,
    np.dtype,
    enum.Enum,
    str,
    bytes,
    int,
    float,
    complex,
    bool,
    type(None),
    np.generic,
    Path,
    range,
    slice,
    frozenset,
)
_GENERATORS = (torch.Generator, np.random.Generator, np.random.RandomState, random.Random)


class CheckpointError(SimulatorError, ValueError):
    """A checkpoint cannot be written or does not belong to the run it is resumed into."""


@dataclass(frozen=True)
class LoopCheckpoint:
    """What ``checkpoint.pkl`` holds: the run it belongs to, the rounds done, the seconds
    the run had taken, and :meth:`LoopState.capture`'s bytes."""

    run_id: str
    round: int
    elapsed: float
    state: bytes
    device: str = "cpu"  # the loop's torch device: a run resumes on the device it ran on
    format: int = FORMAT

    def write(self, folder: Path) -> Path:
        """Write ``folder/checkpoint.pkl`` atomically; returns its path."""
        path = folder / CHECKPOINT_FILE
        write_atomically(path, pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))
        return path

    @staticmethod
    def read(folder: Path, run_id: str) -> LoopCheckpoint | None:
        """The checkpoint in ``folder`` (``None`` if there is none).

        Raises:
            CheckpointError: the file is unreadable or belongs to another run or format.
        """
        path = folder / CHECKPOINT_FILE
        if not path.is_file():
            return None
        try:
            checkpoint = pickle.loads(path.read_bytes())
        except Exception as exc:  # truncated or foreign file: say which and what to do
            raise CheckpointError(
                f"{path} cannot be read ({type(exc).__name__}: {exc}); delete it (or give "
                "--restart) to start the run again"
            ) from exc
        if not isinstance(checkpoint, LoopCheckpoint) or checkpoint.format != FORMAT:
            raise CheckpointError(f"{path} is not a checkpoint of this sharefl; delete it")
        if run_key_of(checkpoint.run_id) != run_key_of(run_id):  # ids of any version
            raise CheckpointError(
                f"{path} belongs to run {checkpoint.run_id}, not {run_id}; delete it"
            )
        return checkpoint

    def check_device(self, device: torch.device | str) -> None:
        """Raise :class:`CheckpointError` unless the run resumes on the device it ran on
        (its tensors and generator states belong there, and another device computes other
        bits)."""
        if str(device) != self.device:
            raise CheckpointError(
                f"the checkpoint was written by a run on {self.device}; resume it with "
                f"--device {self.device} (or delete {CHECKPOINT_FILE} to start again on "
                f"{device})"
            )


def _children(obj: Any) -> Iterator[tuple[Hashable, Any]]:
    """The (step, child) pairs the baseline walks through: attributes of objects with a
    ``__dict__``, items of lists, tuples and deques, values of dicts."""
    if isinstance(obj, (torch.Tensor, np.ndarray, *_STATELESS, *_GENERATORS)):
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield ("key", key), value
    elif isinstance(obj, list | tuple | deque):
        for index, value in enumerate(obj):
            yield ("key", index), value
    elif hasattr(obj, "__dict__"):
        yield from vars(obj).items()


def _digest(array: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(array).view(np.uint8).data).digest()


class LoopState:
    """The baseline of a freshly built ``loop`` and the capture / restore of its state
    (see the module's argument). Build it right after the loop, before any round."""

    def __init__(self, loop: Any) -> None:
        self.paths: dict[int, Path_] = {}
        self.objects: dict[Path_, Any] = {}  # keeps every baseline object alive (ids stay)
        self.versions: dict[int, int] = {}
        self.digests: dict[int, bytes] = {}
        queue: deque[tuple[Path_, Any]] = deque([((), loop)])
        while queue:
            path, obj = queue.popleft()
            if id(obj) in self.paths or isinstance(obj, str | int | float | bool | type(None)):
                continue
            self.paths[id(obj)] = path
            self.objects[path] = obj
            if isinstance(obj, torch.Tensor):
                self.versions[id(obj)] = obj._version
            elif isinstance(obj, np.ndarray):
                self.digests[id(obj)] = _digest(obj)
            queue.extend(((*path, step), child) for step, child in _children(obj))

    def capture(self) -> bytes:
        """The loop's state now, as bytes for :meth:`restore`.

        Raises:
            CheckpointError: an object the rounds created cannot be pickled (its path and
                type are named).
        """
        contents: dict[Path_, Any] = {}
        for path, obj in self.objects.items():
            key = id(obj)
            if isinstance(obj, torch.Tensor):
                if obj._version != self.versions[key]:
                    contents[path] = obj.detach().clone()
            elif isinstance(obj, np.ndarray):
                if _digest(obj) != self.digests[key]:
                    contents[path] = obj.copy()
            elif isinstance(obj, _GENERATORS):
                contents[path] = _generator_state(obj)
            elif isinstance(obj, list | deque):
                contents[path] = list(obj)
            elif isinstance(obj, dict):
                contents[path] = dict(obj)
            elif isinstance(obj, set):
                contents[path] = set(obj)
            elif not isinstance(obj, (tuple, *_STATELESS)) and hasattr(obj, "__dict__"):
                contents[path] = dict(vars(obj))
        contents[_GLOBAL] = _global_generators()
        buffer = io.BytesIO()
        try:
            _BaselinePickler(buffer, self).dump(contents)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"the loop's state cannot be checkpointed: {exc} (an object made during the "
                "rounds that pickle cannot write: keep such objects out of the loop's state "
                "or build them in the constructor)"
            ) from exc
        return buffer.getvalue()

    def restore(self, state: bytes) -> None:
        """Put ``state`` (from :meth:`capture` on a loop of the same configuration) back
        into this freshly built loop, in place.

        Raises:
            CheckpointError: the state names an object this build does not have (another
                configuration or sharefl version wrote it).
        """
        contents = _BaselineUnpickler(io.BytesIO(state), self).load()
        _set_global_generators(contents.pop(_GLOBAL))
        for path, value in contents.items():
            obj = self.objects.get(path)
            if obj is None:
                raise CheckpointError(f"the checkpoint names {_show(path)}, which this run lacks")
            if isinstance(obj, torch.Tensor):
                with torch.no_grad():
                    obj.copy_(value)
            elif isinstance(obj, np.ndarray):
                obj[...] = value
            elif isinstance(obj, _GENERATORS):
                _set_generator_state(obj, value)
            elif isinstance(obj, list | deque):
                obj.clear()
                obj.extend(value)
            elif isinstance(obj, dict | set):
                obj.clear()
                obj.update(value)
            else:
                vars(obj).clear()
                vars(obj).update(value)


def _show(path: Path_) -> str:
    return "loop" + "".join(f"[{s[1]!r}]" if isinstance(s, tuple) else f".{s}" for s in path)


_GLOBAL: Path_ = ("<process>",)  # not an attribute name: no baseline path equals it


def _global_generators() -> dict[str, Any]:
    states = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "random": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_global_generators(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["random"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def _generator_state(generator: Any) -> Any:
    if isinstance(generator, torch.Generator):
        return generator.get_state()
    if isinstance(generator, np.random.Generator):
        return generator.bit_generator.state
    if isinstance(generator, np.random.RandomState):
        return generator.get_state()
    return generator.getstate()


def _set_generator_state(generator: Any, state: Any) -> None:
    if isinstance(generator, torch.Generator):
        generator.set_state(state)
    elif isinstance(generator, np.random.Generator):
        generator.bit_generator.state = state
    elif isinstance(generator, np.random.RandomState):
        generator.set_state(state)
    else:
        generator.setstate(state)


class _BaselinePickler(pickle.Pickler):
    """Writes a baseline object as its path; everything else by value."""

    def __init__(self, file: io.BytesIO, baseline: LoopState) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.baseline = baseline

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, str | int | float | bool | type(None)):
            return None
        return self.baseline.paths.get(id(obj))


class _BaselineUnpickler(pickle.Unpickler):
    """Resolves a path to the object at that path in the fresh build."""

    def __init__(self, file: io.BytesIO, baseline: LoopState) -> None:
        super().__init__(file)
        self.baseline = baseline

    def persistent_load(self, pid: Any) -> Any:
        try:
            return self.baseline.objects[tuple(pid)]
        except KeyError:
            raise CheckpointError(
                f"the checkpoint refers to {_show(tuple(pid))}, which this run lacks"
            ) from None
