"""The trainer process: set up torch.distributed, load (or resume) the model, run SFT or RL steps.

One process per GPU (torchrun); rank r uses ``cuda:LOCAL_RANK`` with NCCL, or the CPU with gloo
where there is no GPU. FSDP2 (``fully_shard`` per decoder layer, then the root) at more than one
rank, and on one GPU in bfloat16 (float32 master weights and optimizer state, bfloat16 compute:
``numerics``); float32 elsewhere. Every micro-batch is one packed row (``packing``) through the
fast path (``token_forward``: chunked LM head, per-document attention). Steps count from 1. TERM/INT sets a flag; at the next step boundary (or while
waiting for a rollout file) every rank agrees to stop, a checkpoint is written, exit code 143.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from slurmrl import heartbeat
from slurmrl.contract.rollouts import RolloutBatch
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime import step_files as steps
from slurmrl.runtime.metrics import Metrics
from slurmrl.runtime.trainer import context_parallel as cpar
from slurmrl.runtime.trainer import dataset, losses, numerics, packing, rl_metrics, rollouts, router_replay, state
from slurmrl.runtime.trainer.deadline import Deadline, job_end_from_env
from slurmrl.runtime.trainer.dist import Dist
from slurmrl.runtime.trainer.lora import AdaptersOff
from slurmrl.runtime.trainer.lora import Policy as LoRAPolicy
from slurmrl.runtime.trainer.mesh_apply import ExpertMesh
from slurmrl.runtime.trainer.publish import FolderWriter, Publisher, broadcast_work, flat_host_memory
from slurmrl.runtime.trainer.ready import mark_ready
from slurmrl.runtime.trainer.token_forward import FastPath, logprobs
from slurmrl.settings.trainer import TrainerSettings

STOP = threading.Event()
EXIT_STOPPED = 143


def _on_signal(signum, _frame):
    if not STOP.is_set():
        print(f"slurmrl: trainer: got {signal.Signals(signum).name}: checkpoint at the next step boundary, then stop",
              flush=True)
    STOP.set()


def resolve(path: str, run_dir: Path) -> tuple[str, Path | None]:
    """A local path (as given, or relative to the run dir) -> (str, Path); else a hub id -> (id, None)."""
    for p in (Path(path), run_dir / path):
        if p.exists():
            return str(p.resolve()), p.resolve()
    return path, None


def untie(model) -> None:
    """Give the LM head its own weight: the published weights are untied (vLLM's reload needs it)."""
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and emb is not None and head.weight is emb.weight:
        head.weight = torch.nn.Parameter(emb.weight.detach().clone())
    model.config.tie_word_embeddings = False
    if getattr(model.config, "get_text_config", None):
        model.config.get_text_config().tie_word_embeddings = False


def load_model(path: str, d: Dist, gradient_checkpointing: bool | str, trainable: bool = True,
               trust_remote_code: bool = False, prepare=None, compile_layers: bool = False,
               micro_tokens: int = 0, log=print, experts: ExpertMesh | None = None):
    """The model at ``path`` on this rank's device, ready to train (or frozen): see ``ready_model``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust_remote_code)
    return ready_model(model, d, gradient_checkpointing, trainable, prepare, compile_layers, micro_tokens, log,
                       experts)


def ready_model(model, d: Dist, gradient_checkpointing: bool | str, trainable: bool = True, prepare=None,
                compile_layers: bool = False, micro_tokens: int = 0, log=print, experts: ExpertMesh | None = None):
    """A float32 model made ready as the trainer runs it: untied head, LoRA, the fast path's head
    and attention, its expert slices (``experts``), activation recompute by policy, compiled layers
    (CUDA), FSDP2 (the expert slices left out). -> (model, FastPath)"""
    untie(model)
    if prepare is not None:  # a LoRA policy wraps its layers (and loads its adapter) before sharding
        prepare(model)
    model.config.use_cache = False
    fast = FastPath.prepare(model)
    if not trainable and d.bf16:  # a frozen reference needs no float32 master weights
        model.to(torch.bfloat16)
    model.to(d.device)
    ignored = experts.apply(model) if experts is not None else None
    if trainable:
        recompute = gradient_checkpointing
        if recompute == "auto":
            recompute, why = numerics.needs_recompute(model, d.device, d.world, micro_tokens, 2 if d.bf16 else 4)
            log(why)
        if recompute:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
    else:
        model.eval()
        model.requires_grad_(False)
    if compile_layers and d.cuda:
        log(f"torch.compile on {numerics.compile_layers(model)} decoder layers")
    if numerics.sharded_always(d.cuda, d.bf16, d.world) and (trainable or d.world > 1):
        numerics.shard(model, d.device.type, d.world, d.bf16 and trainable, ignored, d.replicate)
    return model, fast


def grad_norm_and_clip(model, max_norm: float) -> float:
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


class Trainer:
    def __init__(self, s: TrainerSettings, target=None):
        """``target``: where weights go by broadcast (``weight_sync.Target``), None for filesystem sync."""
        self.s, self.run_dir = s, s.root
        self.target, self.broadcaster = target, None
        self.kind = s.kind
        self.flat_memory = flat_host_memory()  # before the first large allocation
        self.d = Dist(s.dtype)
        self.rank, self.world = self.d.rank, self.d.world
        self.seed, self.max_steps, self.micro, self.seq_len = s.seed, s.max_steps, s.micro_batch_size, s.seq_len
        self.every, self.keep = s.checkpoint_every, s.keep_checkpoints
        self.ckpt_root = RunDir(self.run_dir).checkpoints
        self.weights_root = RunDir(self.run_dir).weights
        if s.dtype == "bfloat16" and not self.d.bf16:
            self.log(f"dtype bfloat16 asked but {self.d.device.type} has no bf16 here: training in float32")
        self.publish_dtype = torch.bfloat16 if s.dtype == "bfloat16" else torch.float32
        if s.world_size != self.world:
            self.log(f"note: the plan says world size {s.world_size}, torchrun started {self.world}")
        p = s.parallel
        if p.dp_replicate > 1 and p.ep > 1:  # plan refuses it too
            raise SystemExit("slurmrl: trainer: trainer.parallel.dp_replicate > 1 with ep > 1 is not run: set one to 1")
        self.d.replicate = p.dp_replicate
        for name in ("dp_replicate", "cp", "ep"):
            if self.world % getattr(p, name):
                raise SystemExit(f"slurmrl: trainer: trainer.parallel.{name} = {getattr(p, name)} does not divide "
                                 f"{self.world} ranks")
        if p.ep > 1 and s.lora:
            raise SystemExit("slurmrl: trainer: trainer.parallel.ep > 1 with a LoRA policy is not run: set ep = 1")
        # the ranks of a cp group share each row (a slice each): rows are split over the dp ranks
        self.cp, self.dp_world, self.dp_rank, self.cp_rank = p.cp, self.world // p.cp, self.rank // p.cp, self.rank % p.cp
        self.cp_group = cpar.groups(self.world, p.cp, self.rank) if p.cp > 1 else None
        self.experts = ExpertMesh(self.world, self.rank, p.ep) if p.ep > 1 else None

    # ---- helpers ---------------------------------------------------------------------
    def sharding(self) -> str:
        if not numerics.sharded_always(self.d.cuda, self.d.bf16, self.world):
            return "no sharding"
        if self.d.replicate > 1:
            return f"FSDP2 HSDP ({self.d.replicate} replicas x {self.world // self.d.replicate} shards)"
        return "FSDP2"

    def log(self, msg: str, all_ranks: bool = False) -> None:
        if all_ranks or self.rank == 0:
            print(f"slurmrl: trainer.{self.rank}: {msg}", flush=True)

    def local(self, row: packing.PackedRow) -> packing.PackedRow:
        """This rank's part of a row: its cp slice, or the whole row without context parallelism."""
        return cpar.shard(row, self.cp_rank, self.cp, self.pad_id) if self.cp > 1 else row

    def logprobs(self, model, row: packing.PackedRow) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy) at the row's target tokens (no autocast: FSDP2 casts, see numerics)."""
        return logprobs(model, row, self.d.device, self.fast)

    # ---- setup -----------------------------------------------------------------------
    def setup(self) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        s = self.s
        torch.manual_seed(self.seed)
        self.model_id, self.model_dir = resolve(s.model, self.run_dir)
        self.start, ckpt = state.latest_checkpoint(self.ckpt_root)
        self.ckpt = ckpt
        self.lora = LoRAPolicy(s.lora, self.model_id) if s.lora else None  # the base stays frozen: no model/ saved
        source = str(ckpt / "model") if ckpt and not self.lora else self.model_id
        self.log(f"{self.kind} on {self.world} rank(s), device {self.d.device}, "
                 f"{'bfloat16 mixed precision' if self.d.bf16 else 'float32'}, "
                 f"{self.sharding()}; "
                 f"model {source}"
                 + (f" (resuming after step {self.start})" if ckpt else ""))
        t = time.perf_counter()
        self.tok = AutoTokenizer.from_pretrained(self.model_id, trust_remote_code=s.trust_remote_code)
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else (self.tok.eos_token_id or 0)
        self.model, self.fast = load_model(
            source, self.d, s.gradient_checkpointing, trust_remote_code=s.trust_remote_code,
            prepare=self.lora.prepare(ckpt) if self.lora else None, compile_layers=s.compile,
            micro_tokens=self.micro * self.seq_len, log=self.log, experts=self.experts)
        self.log(self.fast.describe())
        if self.experts is not None:
            self.log(self.experts.describe())
        if self.cp_group is not None:
            if not self.fast.doc_attention:
                raise SystemExit("slurmrl: trainer: trainer.parallel.cp needs transformers' attention interface; "
                                 f"{type(self.model).__name__} has none")
            style = cpar.install(self.model, self.cp_group, s.parallel.cp_style)
            self.log(f"context parallel: cp {self.cp} ({style}), {self.dp_world} data-parallel group(s)")
        if self.lora:
            self.log(self.lora.describe(self.model))
        self.config = self.model.config
        self.moe = router_replay.is_moe(self.model)  # rows with recorded experts are replayed
        try:
            self.gen_config = GenerationConfig.from_pretrained(self.model_id)
        except Exception:
            self.gen_config = None
        self.ref = None
        self.kl_coef = s.kl_coef
        self.policy_loss = losses.PolicyLoss.of(s)
        if self.kind == "rl" and self.kl_coef > 0:
            if self.lora:  # the reference is the base: the same model with its adapters off, no second copy
                self.ref = AdaptersOff(self.model)
            else:
                self.ref, _ = load_model(self.model_id, self.d, False, trainable=False,
                                         trust_remote_code=s.trust_remote_code, compile_layers=s.compile,
                                         experts=self.experts)
                if self.cp_group is not None:
                    cpar.install(self.ref, self.cp_group, s.parallel.cp_style)
        self.optim = numerics.optimizer([p for p in self.model.parameters() if p.requires_grad], s.lr,
                                        s.weight_decay, self.d.cuda)
        self.data = None
        if self.kind == "sft":
            from slurmrl.runtime.trainer.data import SFTData, load_jsonl

            if not s.dataset:
                raise SystemExit("slurmrl: trainer: SFT needs trainer.dataset (a JSONL file)")
            why = dataset.problem(s.dataset, self.run_dir)
            if why:
                raise SystemExit(f"slurmrl: trainer: {why}")
            local = dataset.locate(s.dataset, self.run_dir)
            assert local is not None, "dataset.problem() found no problem, so it is there"
            self.data = SFTData(load_jsonl(local, self.tok), self.seq_len, self.pad_id, self.seed)
            self.log(f"dataset {local}: {len(self.data.examples)} examples")
        if ckpt:
            st = json.loads((ckpt / "state.json").read_text())
            state.load_optimizer(ckpt, self.model, self.optim, self.rank, self.experts)
            if not state.load_rng(ckpt, self.rank):
                self.log(f"no RNG state for rank {self.rank} in {ckpt.name}; continuing with a fresh one", True)
            if self.data is not None and "data" in st:
                self.data.seek(st["data"])
        self.metrics = Metrics(self.run_dir, "trainer", s.model_dump(mode="json"), self.log, enabled=self.rank == 0,
                               wandb_prefix="trainer/", tracking_settings=s.wandb)
        dropped = self.metrics.truncate_after(self.start)
        if dropped:
            self.log(f"metrics: dropped {dropped} line(s) of steps after {self.start} (they are redone)")
        if self.rank == 0:
            # broadcast: (re)started servers hold the base model whatever the run dir says: no step is marked
            for root, after in ((self.weights_root, -1 if self.target else self.start), (self.ckpt_root, self.start)):
                gone = state.drop_after(root, after)
                if gone:
                    self.log(f"removed {', '.join(d.name for d in gone)} from {root} (after step {after}; redone)")
        dist.barrier()
        n_params = sum(p.numel() for p in self.model.parameters())
        peak, source = rl_metrics.peak_tflops(self.d.device, self.d.bf16, s.peak_tflops)
        self.flops = rl_metrics.Flops(rl_metrics.flop_params(self.model), self.world, peak)
        self.log(f"MFU = 6·N·tokens/s (+ 2·N·tokens/s through the reference) / (peak x {self.world} device(s)), "
                 f"N = {self.flops.n / 1e6:.1f}M, peak {f'{peak:g} TFLOP/s' if peak else 'none'}: {source}")
        self.log(f"model loaded in {time.perf_counter() - t:.1f}s ({n_params / 1e6:.1f}M parameters)")
        self.publisher = None if self.lora else Publisher(self.model, self.rank, self.world, self.publish_dtype,
                                                          self.log)
        if self.publisher is not None:
            self.send = FolderWriter(self.weights_root, self.publisher.snapshot, self.config, self.gen_config,
                                     self.model_dir, self.tok, self.keep, self.log).write
            self.log(f"weights published beside the next step, {len(self.publisher.layout.buckets)} bucket(s) of "
                     f"<= {self.publisher.layout.bucket_bytes / 2**20:.0f} MiB from a {self.publish_dtype} snapshot"
                     + ("" if self.flat_memory else "; host memory: no glibc mallopt here"))
        if self.target is not None:
            self.broadcaster = sender = self.target.connect(self.model, self.rank, self.publish_dtype, self.log,
                                                            self.publisher.snapshot if self.publisher else None)
            self.send = broadcast_work(sender, self.weights_root, self.keep, self.rank, STOP.is_set)
            if self.start:  # after a requeue: the servers take the checkpoint's weights before any rollout
                self.sync(self.start)
                self.log(f"servers on the weights of checkpoint {self.start} "
                         f"({self.wait_publish() or 0.0:.2f}s, {sender.bytes / 1e9:.3f} GB)")
        mark_ready(self.run_dir)

    # ---- steps -----------------------------------------------------------------------
    def sft_step(self) -> dict:
        global_batch = self.s.global_batch
        if global_batch % (self.dp_world * self.micro):
            raise SystemExit(f"slurmrl: trainer: batch {global_batch} does not split into micro_batch_size "
                             f"{self.micro} x {self.dp_world} data-parallel ranks")
        assert self.data is not None, "kind sft loads its dataset as the trainer starts"
        epoch = self.data.epoch
        packs = self.data.take(global_batch)
        n_tgt = max(1, int(sum(int(p.targets.sum()) for p in packs)))
        tokens = int(sum(int(p.used) for p in packs))
        per_rank = global_batch // self.dp_world
        mine = packs[self.dp_rank * per_rank : (self.dp_rank + 1) * per_rank]
        loss_sum = torch.zeros((), device=self.d.device)
        for k in range(0, per_rank, self.micro):
            logp, _ = self.logprobs(self.model, self.local(packing.pack_sft(mine[k : k + self.micro])))
            loss = -logp.sum()
            (loss * self.world / n_tgt).backward()
            loss_sum += loss.detach()
        (total,) = self.d.sum([loss_sum])
        return {"loss": total / n_tgt, "tokens": tokens, "target_tokens": n_tgt, "epoch": epoch}

    def rl_step(self, batch: RolloutBatch) -> dict:
        samples = batch.samples
        if not samples:
            raise SystemExit(f"slurmrl: trainer: rollout batch for step {batch.step} has no samples")
        n_tgt = max(1, rollouts.target_tokens(samples, self.seq_len))
        tokens = sum(min(len(x.prompt_ids) + len(x.completion_ids), self.seq_len) for x in samples)
        stats = rl_metrics.RLStats(self.d.device)
        for whole in rollouts.split(samples, self.dp_rank, self.dp_world, self.micro, self.seq_len):
            row = self.local(whole)
            with router_replay.replay(self.model, row.experts if self.moe else None):  # forward and backward
                self.rl_row(row, stats, n_tgt)
        rewards = [x.reward for x in samples]
        return {
            **stats.finish(n_tgt), "tokens": tokens, "target_tokens": n_tgt, "samples": len(samples),
            "ref_tokens": tokens if stats.has_ref else 0,
            **rl_metrics.reward_stats(rewards), "policy_step": batch.policy_step,
        }

    def rl_row(self, row: packing.PackedRow, stats: rl_metrics.RLStats, n_tgt: int) -> None:
        """One packed row's forward and backward (under router replay when it carries experts)."""
        logp, entropy = self.logprobs(self.model, row)
        old = row.at_targets("old_logp", self.d.device)
        adv = row.at_targets("advantage", self.d.device)
        ref_logp = None
        if self.ref is not None:
            with torch.no_grad():
                ref_logp, _ = self.logprobs(self.ref, row)
        terms = losses.ppo_clip_terms(logp, old, adv, torch.ones_like(logp, dtype=torch.bool), self.policy_loss,
                                      ref_logp)
        (terms["loss"] * self.world / n_tgt).backward()
        stats.add_tokens(terms, entropy, logp, old, ref_logp)  # KL, entropy, clip: no second forward pass

    def optimizer_step(self) -> float:
        norm = (self.experts.grad_norm_and_clip(self.model, self.s.max_grad_norm) if self.experts is not None
                else grad_norm_and_clip(self.model, self.s.max_grad_norm))
        if math.isfinite(norm):
            self.optim.step()
        else:
            self.log(f"grad norm {norm}: step skipped")
        self.optim.zero_grad(set_to_none=True)
        return norm

    # ---- saving ----------------------------------------------------------------------
    def sync(self, step: int) -> float:
        """Start getting the weights of ``step`` to the servers beside the next step: broadcast
        (then marked for the orchestrator), or published to the run dir (the orchestrator has every
        server reload them). Seconds the step is held (the publish before it, the snapshot)."""
        if self.publisher is None:  # LoRA: the adapter alone (megabytes), in series
            assert self.lora is not None, "only a LoRA policy publishes without a publisher"
            t = time.perf_counter()
            path = self.lora.publish(self.weights_root, step, self.model, self.publish_dtype, self.keep, self.rank)
            self.log(f"weights of step {step} at {path} ({time.perf_counter() - t:.2f}s)")
            return time.perf_counter() - t
        return self.publisher.submit(step, self.send)

    def wait_publish(self) -> float | None:
        """Until the publish in flight is complete (READY written); its seconds."""
        return self.publisher.wait() if self.publisher is not None else None

    def publish(self, step: int) -> None:
        self.sync(step)
        self.wait_publish()

    def export_merged(self) -> None:
        assert self.lora is not None, "called for a LoRA policy only"
        t = time.perf_counter()
        out = self.lora.export(RunDir(self.run_dir).merged_dir(), self.model, self.config, self.gen_config,
                               self.model_dir, self.tok, self.publish_dtype, self.rank)
        self.log(f"merged model (base + adapter) at {out} ({time.perf_counter() - t:.2f}s)")

    def checkpoint(self, step: int, why: str) -> None:
        t = time.perf_counter()
        extra = {"kind": self.kind, "world_size": self.world, "ep": self.s.parallel.ep, "seed": self.seed,
                 "data": self.data.position if self.data is not None else {"next_rollout": step + 1}}
        path = state.save_checkpoint(self.ckpt_root, step, self.model, self.optim, self.config, self.gen_config,
                                     self.model_dir, self.tok, extra, self.keep, self.rank,
                                     write_model=self.lora.checkpoint_writer(self.model) if self.lora else None,
                                     experts=self.experts)
        self.deadline.save_took(time.perf_counter() - t)
        self.log(f"checkpoint ({why}) at {path} ({time.perf_counter() - t:.2f}s)")

    # ---- main loop -------------------------------------------------------------------
    def run(self) -> int:
        self.setup()
        if self.start >= self.max_steps:
            self.log(f"already at step {self.start} of {self.max_steps}: nothing to do")
            return 0
        saved = self.start
        step = first_step = self.start
        first_step += 1
        stopped = self.d.any(STOP.is_set())  # asked to stop while loading: nothing new to save
        # weights + AdamW's two moments: the first estimate of a save's size, until one is timed
        self.deadline = Deadline(job_end_from_env(),
                                 3 * sum(p.numel() * p.element_size() for p in self.model.parameters()))
        lr = self.s.lr
        while step < self.max_steps and not stopped:
            heartbeat.beat()
            if self.publisher is not None:
                self.publisher.check()  # a failed background publish ends the trainer, named
            n = step + 1
            wait_s, batch = 0.0, None
            if self.kind == "rl":
                path = steps.rollout_path(self.run_dir, n)
                waited = steps.wait_until(path.exists, STOP, self.log, str(path), poll=0.2)
                wait_s = waited or 0.0
                if self.d.any(waited is None):
                    stopped = True
                    break
                batch = rollouts.read_batch(path)
            rl_metrics.reset_peak(self.d.device)
            t = time.perf_counter()
            if self.kind == "sft":
                out = self.sft_step()
            else:
                assert batch is not None, "kind rl read its batch above"
                out = self.rl_step(batch)
            norm = self.optimizer_step()
            if self.d.cuda:
                torch.cuda.synchronize()
            step_s = time.perf_counter() - t
            self.deadline.step_took(step_s)
            step = n
            out.update(rl_metrics.memory(self.d.device))
            out.update(self.flops.record(out["tokens"], out.pop("ref_tokens", 0), step_s))
            if self.s.hybrid and self.d.cuda:  # the servers wake into what the trainer leaves: return cached blocks
                torch.cuda.empty_cache()
            sync_s = self.sync(step) if self.kind == "rl" else 0.0
            record = {"step": step, "kind": self.kind, **out, "grad_norm": norm, "lr": lr,
                      "tokens_per_s": out["tokens"] / step_s if step_s > 0 else 0.0, "step_time_s": step_s,
                      "wait_s": wait_s, "publish_s": 0.0 if self.broadcaster else sync_s, "sync_s": sync_s,
                      "sync_background_s": self.publisher.previous_s if self.publisher else None,
                      "sync_share": sync_s / (step_s + sync_s) if step_s + sync_s > 0 else 0.0,
                      "time": time.time()}
            if self.kind == "rl" and isinstance(out.get("policy_step"), int):
                record["off_policy_lag"] = step - 1 - out["policy_step"]
            self.metrics.log(record)
            if self.rank == 0 and step == first_step:
                RunDir(self.run_dir).add_phase(RunDir.attempt_from_env(), f"first trainer step (step {step}, {step_s:.1f}s)")
            kl = "" if out.get("kl") is None else f" kl {out['kl']:.4f}"
            extra = (f"{kl} entropy {out['entropy']:.3f} clip {out['clip_frac']:.3f} "
                     f"reward {out['reward_mean']:.3f}" if self.kind == "rl" else "")
            self.log(f"step {step}/{self.max_steps} loss {out['loss']:.4f}{extra} grad_norm {norm:.3f} "
                     f"{record['tokens_per_s']:.0f} tok/s step {step_s:.2f}s wait {wait_s:.2f}s")
            if step == self.max_steps and self.kind == "sft":  # before the last checkpoint: DONE there means all done
                self.publish(step)
            if step == self.max_steps and self.lora:  # the merged model, also before the last checkpoint
                self.export_merged()
            stopped = self.d.any(STOP.is_set())
            # the save the warning signal asks for might not fit before the time limit: save now
            early = not stopped and self.d.any(self.deadline.save_now())
            self.deadline.saved_early |= early
            if stopped or early or step % self.every == 0 or step == self.max_steps:
                self.wait_publish()  # a checkpoint of step n means READY for step n: a resume never waits for it
                why = ("stop requested" if stopped else "last step" if step == self.max_steps else
                       "early: a save at the next step might not finish before the time limit" if early else "periodic")
                self.checkpoint(step, why)
                saved = step
            if stopped:
                break
        self.wait_publish()
        if stopped and saved < step:
            self.checkpoint(step, "stop requested")
            saved = step
        self.metrics.close(EXIT_STOPPED if stopped and step < self.max_steps else 0)
        if stopped and step < self.max_steps:
            self.log(f"stopped after step {step} (checkpoint complete); exit {EXIT_STOPPED}")
            return EXIT_STOPPED
        self.log(f"done: {step} steps")
        return 0


def run(s: TrainerSettings, target=None) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)
    trainer = Trainer(s, target)
    try:
        return trainer.run()
    finally:
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:
                pass
