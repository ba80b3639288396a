"""The RL loop: rollout, reward, train, convert, transfer, activate, one step at a time, with diagnostics.

Versions: the trainer holds version t after t optimizer steps. After each step (every
`sync interval` steps) version t is converted and transferred; the rollout
activates it before its next batch (colocated) or up to `max_staleness` batches
later (async), and never inside a batch. A refused activation leaves the previous
version active and stops the run with the error that names the tensor.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as load_bytes

from pcc.lang.diagnostics import PccError
from pcc.lang.inputs import InputError, read_bytes, read_json
from pcc.lang.outputs import write_atomic

from . import diagnostics as D
from .checkpoint import save_tensors, write_json
from .rundir import RunDirError
from .settings import MAX_ROWS, RANGES, SettingError, in_range
from .model import Arch, forward
from .objective import advantages, objective
from .rollout import RolloutEngine
from .sync import Fault, SyncError, convert_adapter, manifest, receive, transfer
from .weights import bridge_tensors
from .task import ReverseTask
from .trainer import Trainer
from .warmstart import RECIPE, _Plain, digest, warm_start

MAX_METRICS = 4 << 30  # metrics.jsonl read back on --resume: ~2 KB a step
PHASES = ("activate", "rollout", "rescore", "train", "convert", "transfer", "checkpoint")


class InjectedCrash(PccError, RuntimeError):
    """A crash the run was asked to simulate (fault injection)."""


@dataclass
class RunConfig:
    steps: int = 30
    seed: int = 0
    prompts: int = 64
    group: int = 8
    lr: float = 3e-4
    temperature: float = 1.0
    digits: int = 4
    eps: float = 0.2
    ref_coef: float = 0.0
    bucket_bytes: int = 1 << 20
    warm: dict = field(default_factory=lambda: dict(RECIPE))
    variant: str | None = None  # a Table 5 trainer variant instead of the plan's trainer GEMMs
    fault: Fault | None = None
    crash_at: int | None = None  # raise InjectedCrash in this step, after its rollout

    def check(self) -> None:
        """SettingError (PCC708) for the first setting out of range: a run never starts on a temperature of
        0 (a division by zero) or -1, a negative learning rate, or a batch beyond memory."""
        for name in RANGES:
            if name == "crash_at" and self.crash_at is None:
                continue
            why = in_range(name, getattr(self, name))
            if why is not None:
                raise SettingError(f"{name}: {why}")
        if self.prompts * self.group > MAX_ROWS:
            raise SettingError(f"prompts x group = {self.prompts * self.group}: more than the {MAX_ROWS} sequences "
                               "the embedded runtime holds at once")


@dataclass
class Package:
    version: int
    manifest: dict
    received: dict[str, torch.Tensor]
    nbytes: int


class Run:
    def __init__(self, plan, cfg: RunConfig, out: Path | None = None, resume: bool = False):
        cfg.check()
        self.plan, self.cfg, self.out = plan, cfg, Path(out) if out is not None else None
        c = plan.contract
        self.sync_cfg, self.correction, self.replay = c.sync, c.correction, c.routing_replay
        self.arch = Arch.from_catalog(plan.catalog)
        self.arch.check_catalog(plan.catalog)
        self.task = ReverseTask(cfg.digits)
        torch.manual_seed(cfg.seed)
        self.warm_info: dict = {}  # the warm start's record: steps, attempt, held-out quality, cache key
        warm, self.warm_cached = warm_start(self.arch, self.task, cfg.seed, cfg.warm, info=self.warm_info)
        self.warm_sha256 = digest(warm)  # a resumed run must start from the same warm start
        self.reference = _Plain(warm)  # the BF16 reference policy
        self.trainer = Trainer(self.arch, plan, warm, cfg.lr, cfg.variant, cfg.seed)
        self.rollout = RolloutEngine(self.arch, plan, self.trainer.scaling)
        self.adapter = c.sync.moves == "adapter"
        self.pending: list[Package] = []
        self.saved: dict[str, dict] = {}  # pending-V.safetensors -> its record: written once per version
        self.history: list[dict] = []
        self.start = 0
        if resume and self.out is not None:
            self._restore()  # RunDirError when there is nothing (whole) to resume: never a silent fresh start
        else:
            base = bridge_tensors(plan, self.trainer.weights(), c.sync.bridge)  # version 0
            self.rollout.activate(manifest(0, "full_weights", base, c.sync.bridge),
                                  receive(transfer(base, cfg.bucket_bytes)))
            if self.adapter:  # then the initial adapter over it
                ad = convert_adapter(self.trainer.adapters)
                self.rollout.activate(manifest(0, "adapter", ad), receive(transfer(ad, cfg.bucket_bytes)))
            if self.out is not None:
                (self.out / "metrics.jsonl").unlink(missing_ok=True)

    @property
    def lag(self) -> int:
        """How many versions behind the rollout may run."""
        s = self.sync_cfg
        return (s.max_staleness if s.schedule == "async" else 0) + s.interval - 1

    # -- one step -----------------------------------------------------------------------
    def _activate(self, times: dict) -> None:
        """Activate the newest transferred version the schedule lets the rollout see by now."""
        t0 = time.perf_counter()
        delay = self.sync_cfg.max_staleness if self.sync_cfg.schedule == "async" else 0
        ready = [p for p in self.pending if self.trainer.version - p.version >= delay]
        if ready:
            newest = max(ready, key=lambda p: p.version)
            self.rollout.activate(newest.manifest, newest.received)  # raises SyncError; active untouched
            self.pending = [p for p in self.pending if p.version > newest.version]
        times["activate"] = time.perf_counter() - t0

    def step(self, s: int) -> dict:
        cfg, times = self.cfg, {}
        self._activate(times)
        age = self.trainer.version - self.rollout.active.version
        if age > self.lag:
            raise RuntimeError(f"step {s}: rollout version {self.rollout.active.version} is {age} behind the trainer, "
                               f"beyond the contract's bound {self.lag}")
        t0 = time.perf_counter()
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + s)
        prompts = self.task.prompts(cfg.prompts, gen).repeat_interleave(cfg.group, 0)
        batch = self.rollout.generate(prompts, self.task.answer_len, cfg.temperature, gen)
        times["rollout"] = time.perf_counter() - t0
        if cfg.crash_at == s:
            raise InjectedCrash(f"injected crash in step {s}, after its rollout")
        reward, exact = self.task.reward(batch.tokens)
        mask = self.task.response_mask(batch.tokens)
        p = batch.prompt_len

        t0 = time.perf_counter()
        mu_t = batch.logp
        if age > 0:  # re-score with the rollout engine as it would run the trainer's version
            cur = next((q for q in self.pending if q.version == self.trainer.version), None)
            man, received = (cur.manifest, cur.received) if cur is not None else self._package()
            w = self.rollout.decode(man, received, self.rollout.active)
            mu_t = self.rollout.score(w, batch.tokens, p, cfg.temperature)
        times["rescore"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        replay = batch.routes if self.replay == "r3" and self.arch.is_moe else None
        logp, lsm, routes = self.trainer.logprobs(batch.tokens, p, cfg.temperature, replay)
        with torch.no_grad():
            ref_lp, ref_lsm, _ = _score(self.arch, self.reference, batch.tokens, p, cfg.temperature)
        adv = advantages(reward, cfg.group)
        obj = objective(logp, batch.logp, adv, mask, self.correction, cfg.eps, ref_lp, cfg.ref_coef)
        pi = logp.detach()
        grad_norm = self.trainer.step(obj.loss)
        times["train"] = time.perf_counter() - t0

        m = {"step": s, "version": self.trainer.version - 1, "rollout_version": self.rollout.active.version,
             "version_age": age, "reward": float(reward.mean()), "exact_match": float(exact.mean()),
             "entropy": D.entropy(lsm.detach(), mask), "loss": float(obj.loss.detach()), "grad_norm": grad_norm,
             "ppo_clip_frac": obj.clip_frac, "tis_clip_frac": obj.is_clip_frac, "is_weight_mean": obj.is_weight_mean}
        m.update(D.abs_stats(pi - mu_t, mask, "same_version_abs_dlogp"))
        m["same_version_abs_dlogp_by_position"] = D.by_position(pi - mu_t, mask)
        m.update(D.abs_stats(mu_t - batch.logp, mask, "staleness_abs_dlogp"))
        m["staleness_dlogp_mean"] = float(((mu_t - batch.logp) * mask).sum() / mask.sum())
        m.update(D.abs_stats(pi - batch.logp, mask, "total_abs_dlogp"))
        m["trainer_rollout_kl"] = D.kl_rows(batch.logits, lsm.detach(), mask)
        m["reference_kl"] = D.kl_rows(lsm.detach(), ref_lsm, mask)
        m.update(D.route_agreement(routes.own, batch.routes, p, mask))
        if self.arch.is_moe:
            used = D.route_agreement(routes.used, batch.routes, p, mask)
            m["routes_used_agreement"] = used["route_agreement"]
        m["versions_in_batch"] = sorted({int(v) for v in batch.version.unique()})

        if self.trainer.version % self.sync_cfg.interval == 0:
            self._sync(times, m)
        t0 = time.perf_counter()
        self.history.append(m)
        self._checkpoint(s + 1)
        times["checkpoint"] = time.perf_counter() - t0
        m["time"] = {k: round(times.get(k, 0.0), 5) for k in PHASES}
        if self.out is not None:
            with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(m) + "\n")
        return m

    def _package(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """(manifest, tensors) of the trainer's current version, as the converter plan sends it."""
        if self.adapter:
            tensors = convert_adapter(self.trainer.adapters)
            return manifest(self.trainer.version, "adapter", tensors), tensors
        tensors = bridge_tensors(self.plan, self.trainer.weights(), self.sync_cfg.bridge)
        return manifest(self.trainer.version, "full_weights", tensors, self.sync_cfg.bridge), tensors

    def _sync(self, times: dict, m: dict) -> None:
        v = self.trainer.version
        t0 = time.perf_counter()
        man, tensors = self._package()
        times["convert"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        buckets = transfer(tensors, self.cfg.bucket_bytes, self.cfg.fault, v)
        received = receive(buckets)
        times["transfer"] = time.perf_counter() - t0
        nbytes = sum(t["bytes"] for t in man["tensors"].values())
        self.pending.append(Package(v, man, received, nbytes))
        m["sync_bytes"], m["sync_buckets"], m["sync_moves"] = nbytes, len(buckets), man["moves"]

    # -- persistence --------------------------------------------------------------------
    def _checkpoint(self, completed: int) -> None:
        """Each step's tensors go to new files named by the step, then state.json (atomic) names them with their
        SHA-256, then the old ones go: a crash at any point leaves one whole checkpoint that state.json names."""
        if self.out is None:
            return
        d = self.out / "checkpoint"
        act = self.rollout.active
        files = {"trainer": self._save(d, f"trainer-{completed}.safetensors", self.trainer.state()),
                 "rollout": self._save(d, f"rollout-{completed}.safetensors", act.wire)}
        if act.base is not None:
            files["rollout_base"] = self._save(d, f"rollout-base-{completed}.safetensors", act.base.wire)
        for q in self.pending:
            name = f"pending-{q.version}.safetensors"
            if name not in self.saved:
                files[name] = self._save(d, name, q.received)
            else:
                files[name] = self.saved[name]
        write_json(d / "state.json", {"completed": completed, "version": self.trainer.version,
                                      "opt_steps": self.trainer.steps, "rollout_manifest": act.manifest,
                                      "base_manifest": act.base.manifest if act.base is not None else None,
                                      "pending": [{"version": q.version, "manifest": q.manifest, "bytes": q.nbytes}
                                                  for q in self.pending],
                                      "warm_sha256": self.warm_sha256, "files": files})
        keep = {f["name"] for f in files.values()}
        self.saved = {k: v for k, v in files.items() if k.startswith("pending-")}
        for f in d.glob("*.safetensors"):  # the previous step's, versions activated or superseded
            if f.name not in keep:
                f.unlink()

    @staticmethod
    def _save(d: Path, name: str, tensors: dict) -> dict:
        save_tensors(d / name, tensors)
        return {"name": name, "sha256": hashlib.sha256((d / name).read_bytes()).hexdigest()}

    def _restore(self) -> None:
        """Continue from checkpoint/state.json; RunDirError naming the file when it or a file it names is
        missing, damaged (its SHA-256 differs) or of another run."""
        d = self.out / "checkpoint"
        state = d / "state.json"
        if not state.exists():
            raise RunDirError(f"{state}: missing: no completed step to resume (the metrics are kept); "
                              "--force starts the run again")
        try:
            st = read_json(state, what="run state")
            start, version, opt_steps = st["completed"], st["version"], st["opt_steps"]
            files, pending = st["files"], st["pending"]
            if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (start, version, opt_steps)):
                raise ValueError("step counts are not whole numbers")
        except InputError as exc:
            raise RunDirError(f"{exc.message}; the run cannot be resumed (--force starts it again)") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise RunDirError(f"{state}: damaged ({type(exc).__name__}: {exc}); the run cannot be resumed "
                              "(--force starts it again)") from None
        if st.get("warm_sha256") != self.warm_sha256:
            raise RunDirError(f"{state}: the run began from another warm start than the one this machine builds now "
                              "(a changed or damaged warm-start cache, or another pcc); it cannot be resumed exactly: "
                              "--force starts it again")
        try:
            self.trainer.load_state(self._load(d, files["trainer"]), version, opt_steps)
            if st["base_manifest"] is not None:  # an adapter installs over its base
                self.rollout.activate(st["base_manifest"], self._load(d, files["rollout_base"]))
            self.rollout.activate(st["rollout_manifest"], self._load(d, files["rollout"]))
            for q in pending:
                name = f"pending-{q['version']}.safetensors"
                self.pending.append(Package(q["version"], q["manifest"], self._load(d, files[name]), q["bytes"]))
                self.saved[name] = files[name]
        except RunDirError:
            raise
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise RunDirError(f"{state}: does not fit this run ({type(exc).__name__}: {exc}); --force starts it "
                              "again") from None
        self.start = start
        self.history = []
        metrics = self.out / "metrics.jsonl"
        if metrics.exists():
            try:
                text = read_bytes(metrics, MAX_METRICS, "metrics file").decode("utf-8", errors="replace")
            except InputError as exc:
                raise RunDirError(f"{exc.message}; the run cannot be resumed") from None
            for n, line in enumerate(text.splitlines(), 1):
                try:
                    m = json.loads(line)
                    step = m["step"]
                except (ValueError, KeyError, TypeError):
                    if n == 1 + start:  # a line cut by the crash after the last completed step
                        break
                    raise RunDirError(f"{metrics}:{n}: damaged; the run cannot be resumed") from None
                if step < start:
                    self.history.append(m)
        write_atomic(metrics, "".join(json.dumps(x) + "\n" for x in self.history))

    @staticmethod
    def _load(d: Path, rec) -> dict[str, torch.Tensor]:
        """The tensors of a checkpoint file state.json names, if its bytes are the ones recorded."""
        if not isinstance(rec, dict) or not isinstance(rec.get("name"), str) or "/" in rec["name"]:
            raise RunDirError(f"{d / 'state.json'}: damaged (a file record is {rec!r})")
        path = d / rec["name"]
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise RunDirError(f"{path}: cannot read ({exc.strerror}); the run cannot be resumed") from None
        if hashlib.sha256(data).hexdigest() != rec.get("sha256"):
            raise RunDirError(f"{path}: damaged (its SHA-256 is not the one state.json recorded); the run cannot be "
                              "resumed (--force starts it again)")
        try:
            return load_bytes(data)
        except Exception as exc:  # noqa: BLE001 - the safetensors parser's own error, on bytes we hashed
            raise RunDirError(f"{path}: unreadable ({exc}); the run cannot be resumed") from None


def _score(arch, ex, tokens, prompt_len, temperature):
    logits, routes = forward(arch, ex, tokens[:, :-1])
    lsm = torch.log_softmax(logits[:, prompt_len - 1:] / temperature, -1)
    return lsm.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1), lsm, routes


__all__ = ["Run", "RunConfig", "InjectedCrash", "SyncError", "PHASES"]
