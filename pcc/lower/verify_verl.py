"""Check a verl job (pcc.lower.verl's Hydra overrides) with verl's own Hydra configs and config classes.

verl lives in a side folder (requirements/verl.txt, --no-deps), never in pcc's site-packages: its
requirements would replace pcc's transformers. The check runs in a child process that appends that
folder to sys.path and answers one JSON batch. For each job it composes verl's config
(`ppo_megatron_trainer` / `ppo_trainer`, as `python -m verl.trainer.main_ppo --config-name` does)
with the overrides, so an unknown or mistyped key fails in Hydra, then builds verl's RolloutConfig,
actor config (McoreActorConfig / FSDPActorConfig) and AlgoConfig from it (`omega_conf_to_dataclass`,
what verl's workers call), and checks each actor.megatron.override_transformer_config key against
megatron-core's TransformerConfig fields (verl builds a TransformerConfig from them). Job-level
values pcc does not decide (batch sizes; the model path, whose HFModelConfig reads a real model) are
the caller's `job` overrides.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pcc.lower.engine_errors import EngineMissing, VerifyError  # noqa: F401 - both part of this module's API
from pcc.lower.side_folder import folder, run_child

DIR_ENV = "PCC_VERL_DIR"  # folder holding verl/ (pip --target); default below
HINT = "install with requirements/install-engines.sh (see requirements/verl.txt)"
# What a job states beside pcc's overrides for verl's actor config to build (the user's part after `--`).
JOB = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"]


def engine_dir() -> Path:
    return folder(DIR_ENV, "verl")


def run_batch(jobs: list[dict]) -> dict:
    """Check jobs {"config": name, "overrides": [...], "log_ratio"?, "mask"?} in one child: {"version", "jobs":
    [fields | {"error"}]}. With log_ratio and mask ([batch][tokens]) verl's own rollout correction
    (`compute_rollout_correction_weights`) weighs them as the job's algorithm.rollout_correction says."""
    return run_child("pcc.lower.verify_verl", engine_dir(), ("verl",), {"jobs": list(jobs)}, "verl's checks", HINT)


def verify_verl_job(config: str, overrides: list[str]) -> dict:
    out = run_batch([{"config": config, "overrides": overrides}])["jobs"][0]
    if "error" in out:
        raise VerifyError(out["error"])
    return out


# ---- the child: runs with verl importable ----------------------------------------------------------

def _child(request: dict) -> dict:
    sys.path.append(request["dir"])
    import dataclasses

    import torch
    import verl
    from hydra import compose, initialize_config_dir
    from megatron.core.transformer.transformer_config import TransformerConfig
    from omegaconf import OmegaConf
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.utils.config import omega_conf_to_dataclass

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    te_fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    out = {"version": verl.__version__, "jobs": []}
    for job in request["jobs"]:
        try:
            with initialize_config_dir(config_dir=config_dir, version_base=None):
                cfg = compose(config_name=job["config"], overrides=[*job["overrides"], *JOB])
            rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
            actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
            algo = omega_conf_to_dataclass(cfg.algorithm)
            mega = getattr(actor, "megatron", None)
            te = dict(mega.override_transformer_config) if mega is not None else {}
            unknown = sorted(set(te) - te_fields)
            if unknown:
                raise VerifyError(f"override_transformer_config keys that are no TransformerConfig field: {unknown}")
            corr = RolloutCorrectionConfig(**OmegaConf.to_container(cfg.algorithm.rollout_correction))
            weights = None
            if job.get("log_ratio") is not None and corr.rollout_is is not None:
                w, _ = compute_rollout_correction_weights(
                    torch.tensor(job["log_ratio"], dtype=torch.float64), torch.tensor(job["mask"], dtype=torch.float64),
                    rollout_is=corr.rollout_is, rollout_is_threshold=corr.rollout_is_threshold)
                weights = w.tolist()
            lora = OmegaConf.to_container(cfg.actor_rollout_ref.model.lora) if "lora" in cfg.actor_rollout_ref.model \
                else None
            out["jobs"].append({
                "rollout": {k: getattr(rollout, k) for k in (
                    "name", "tensor_model_parallel_size", "data_parallel_size", "expert_parallel_size", "quantization",
                    "calculate_log_probs", "full_determinism", "enable_rollout_routing_replay", "response_length")}
                | {"engine_kwargs": OmegaConf.to_container(cfg.actor_rollout_ref.rollout.engine_kwargs)},
                "actor": {"class": type(actor).__name__, "strategy": actor.strategy,
                          "router_replay": mega.router_replay.mode if mega is not None else None,
                          "transformer": te,
                          "engine": {k: getattr(mega, k) for k in (
                              "tensor_model_parallel_size", "pipeline_model_parallel_size",
                              "expert_model_parallel_size", "expert_tensor_parallel_size",
                              "use_distributed_optimizer")} if mega is not None else None},
                "algorithm": {"class": type(algo).__name__, "rollout_is": corr.rollout_is,
                              "rollout_is_threshold": corr.rollout_is_threshold, "weights": weights},
                "lora": lora,
                "env": OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env).get("env_vars", {}),
            })
        except Exception as exc:  # Hydra's, OmegaConf's and verl's own errors: the verdict to report
            out["jobs"].append({"error": f"{type(exc).__name__}: {exc}"})
    return out


if __name__ == "__main__":
    result = _child(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + json.dumps(result, default=str) + "\n")
