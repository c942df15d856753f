"""The trainer process: set up torch.distributed, load (or resume) the model, run SFT or RL steps.

One process per GPU (torchrun); rank r uses ``cuda:LOCAL_RANK`` with NCCL, or the CPU with gloo
where there is no GPU. FSDP2 (``fully_shard`` per decoder layer, then the root) at more than one
rank, and on one GPU in bfloat16 (float32 master weights and optimizer state, bfloat16 compute:
``numerics``); float32 elsewhere. Every micro-batch is one packed row (``packing``) through the
fast path (``token_forward``: chunked LM head, per-document attention). The device mesh (FSDP2/HSDP,
context and expert parallel groups, this rank's dp/cp ranks) is one ``mesh.TrainerMesh``, checked by
the plan's own rules at start and against the model at load. Steps count from 1. TERM/INT sets a
flag; at the next step boundary (or while waiting for a rollout file) every rank agrees to stop, a
checkpoint is written, exit code 143.

``Trainer`` reads as the orchestrator's loop does: ``setup`` decides once (the model and its mesh,
the checkpoint to resume, the reference, the data, how weights leave), then ``run`` repeats
``train_step`` and ``save_due`` and ends in ``finish``.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time

import torch
import torch.distributed as dist

from slurmrl import heartbeat
from slurmrl.contract.metrics import TrainerRow
from slurmrl.contract.rollouts import RolloutBatch
from slurmrl.rundir.paths import RunDir
from slurmrl.runtime import step_files as steps
from slurmrl.runtime.metrics import Metrics
from slurmrl.runtime.trainer import commit as checkpoint_commit
from slurmrl.runtime.trainer import context_parallel as cpar
from slurmrl.runtime.trainer import dataset, losses, numerics, packing, rl_metrics, rollouts, router_replay, state
from slurmrl.runtime.trainer.deadline import Deadline, job_end_from_env
from slurmrl.runtime.trainer.dist import Dist
from slurmrl.runtime.trainer.lora import AdaptersOff
from slurmrl.runtime.trainer.lora import Policy as LoRAPolicy
from slurmrl.runtime.trainer.mesh import TrainerMesh
from slurmrl.runtime.trainer.model import load_model, resolve
from slurmrl.runtime.trainer.publish import FolderWriter, Publisher, broadcast_work, flat_host_memory
from slurmrl.runtime.trainer.ready import mark_ready
from slurmrl.runtime.trainer.stage import Stager
from slurmrl.runtime.trainer.token_forward import logprobs
from slurmrl.settings.trainer import CpStyle, TrainerSettings

STOP = threading.Event()
EXIT_STOPPED = 143


def _on_signal(signum, _frame):
    if not STOP.is_set():
        print(f"slurmrl: trainer: got {signal.Signals(signum).name}: checkpoint at the next step boundary, then stop",
              flush=True)
    checkpoint_commit.Stop.note()  # a save in progress gets slurm.grace_seconds from now
    STOP.set()


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
        self.mesh = TrainerMesh.build(s.parallel, self.world, self.rank, s.seq_len, s.lora is not None)
        self.cp_style: CpStyle | None = None  # what attention runs under cp, once installed on the model
        self.kl_coef, self.policy_loss = s.kl_coef, losses.PolicyLoss.of(s)

    # ---- helpers ---------------------------------------------------------------------
    def sharding(self) -> str:
        return self.mesh.sharding(numerics.sharded_always(self.d.cuda, self.d.bf16, self.world))

    def log(self, msg: str, all_ranks: bool = False) -> None:
        if all_ranks or self.rank == 0:
            print(f"slurmrl: trainer.{self.rank}: {msg}", flush=True)

    def local(self, row: packing.PackedRow) -> packing.PackedRow:
        """This rank's part of a row: its cp slice, or the whole row without context parallelism."""
        if self.cp_style is None:
            return row
        return cpar.shard(row, self.mesh.cp_rank, self.mesh.cp, self.pad_id, style=self.cp_style)

    def logprobs(self, model, row: packing.PackedRow) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy) at the row's target tokens (no autocast: FSDP2 casts, see numerics)."""
        return logprobs(model, row, self.d.device, self.fast)

    # ---- setup -----------------------------------------------------------------------
    def setup(self) -> None:
        """Decide once (model, checkpoint, reference, data, publishing), then ``run`` steps."""
        s = self.s
        torch.manual_seed(self.seed)
        self.model_id, self.model_dir = resolve(s.model, self.run_dir)
        self.start, self.ckpt = checkpoint_commit.resume_point(self.ckpt_root, self.rank, self.world, self.log)
        self.commit_group = checkpoint_commit.group(self.world)
        self.stage = Stager(s.checkpoint_stage_dir, self.run_dir, self.rank) if s.checkpoint_stage_dir else None
        self.lora = LoRAPolicy(s.lora, self.model_id) if s.lora else None  # the base stays frozen: no model/ saved
        source = str(self.ckpt / "model") if self.ckpt and not self.lora else self.model_id
        self.log(f"{self.kind} on {self.world} rank(s), device {self.d.device}, "
                 f"{'bfloat16 mixed precision' if self.d.bf16 else 'float32'}, "
                 f"{self.sharding()}; "
                 f"model {source}"
                 + (f" (resuming after step {self.start})" if self.ckpt else ""))
        if self.world > 1:
            self.log(self.mesh.describe())
        t = time.perf_counter()
        self.load_policy(source)
        self.ref = self.load_reference()
        self.optim = numerics.optimizer([p for p in self.model.parameters() if p.requires_grad], s.lr,
                                        s.weight_decay, self.d.cuda)
        self.data = self.load_data() if self.kind == "sft" else None
        self.resume()
        self.open_metrics()
        dist.barrier()
        self.count_flops(t)
        self.start_publishing()
        mark_ready(self.run_dir)

    def attention(self, model) -> CpStyle | None:
        """Context-parallel attention over this rank's cp group on ``model`` -> its style (None: no cp)."""
        if self.mesh.cp_group is None:
            return None
        return cpar.install(model, self.mesh.cp_group, self.s.parallel.cp_style)

    def load_policy(self, source: str) -> None:
        """The tokenizer and the model trained (its fast path, experts, cp attention, LoRA adapters)."""
        from transformers import AutoTokenizer, GenerationConfig

        s = self.s
        self.tok = AutoTokenizer.from_pretrained(self.model_id, trust_remote_code=s.trust_remote_code)
        self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else (self.tok.eos_token_id or 0)
        self.model, self.fast = load_model(
            source, self.d, s.gradient_checkpointing, trust_remote_code=s.trust_remote_code,
            prepare=self.lora.prepare(self.ckpt) if self.lora else None, compile_layers=s.compile,
            micro_tokens=self.micro * self.seq_len, log=self.log, mesh=self.mesh)
        self.log(self.fast.describe())
        if self.mesh.experts is not None:
            self.log(self.mesh.experts.describe())
        if self.mesh.cp_group is not None:
            if not self.fast.doc_attention:
                raise SystemExit("slurmrl: trainer: trainer.parallel.cp needs transformers' attention interface; "
                                 f"{type(self.model).__name__} has none")
            self.cp_style = self.attention(self.model)
            self.log(self.mesh.describe_cp(self.cp_style or ""))
        if self.lora:
            self.log(self.lora.describe(self.model))
        self.config = self.model.config
        self.moe = router_replay.is_moe(self.model)  # rows with recorded experts are replayed
        try:
            self.gen_config = GenerationConfig.from_pretrained(self.model_id)
        except Exception:
            self.gen_config = None

    def load_reference(self):
        """RL with a KL term: the frozen reference model (LoRA: the policy with its adapters off), else None."""
        if self.kind != "rl" or self.kl_coef <= 0:
            return None
        if self.lora:  # the reference is the base: the same model with its adapters off, no second copy
            return AdaptersOff(self.model)
        s = self.s
        ref, _ = load_model(self.model_id, self.d, False, trainable=False, trust_remote_code=s.trust_remote_code,
                            compile_layers=s.compile, mesh=self.mesh)
        self.attention(ref)
        return ref

    def load_data(self):
        """SFT: the dataset, packed into rows."""
        from slurmrl.runtime.trainer.data import SFTData, load_jsonl

        s = self.s
        if not s.dataset:
            raise SystemExit("slurmrl: trainer: SFT needs trainer.dataset (a JSONL file)")
        why = dataset.problem(s.dataset, self.run_dir)
        if why:
            raise SystemExit(f"slurmrl: trainer: {why}")
        local = dataset.locate(s.dataset, self.run_dir)
        assert local is not None, "dataset.problem() found no problem, so it is there"
        data = SFTData(load_jsonl(local, self.tok), self.seq_len, self.pad_id, self.seed)
        self.log(f"dataset {local}: {len(data.examples)} examples")
        return data

    def resume(self) -> None:
        """From the latest checkpoint, if any: optimizer state, RNG, the data position."""
        ckpt = self.ckpt
        if not ckpt:
            return
        st = json.loads((ckpt / "state.json").read_text())
        state.load_optimizer(ckpt, self.model, self.optim, self.rank, self.mesh.experts)
        if not state.load_rng(ckpt, self.rank):
            self.log(f"no RNG state for rank {self.rank} in {ckpt.name}; continuing with a fresh one", True)
        if self.data is not None and "data" in st:
            self.data.seek(st["data"])

    def open_metrics(self) -> None:
        """The metrics file, cut back to the step resumed from; the weights and checkpoints after it removed."""
        s = self.s
        self.metrics = Metrics(self.run_dir, "trainer", s.model_dump(mode="json"), self.log, enabled=self.rank == 0,
                               wandb_prefix="trainer/", tracking_settings=s.wandb)
        dropped = self.metrics.truncate_after(self.start)
        if dropped:
            self.log(f"metrics: dropped {dropped} line(s) of steps after {self.start} (they are redone)")
        if self.rank != 0:
            return
        # broadcast: (re)started servers hold the base model whatever the run dir says: no step is marked
        for root, after in ((self.weights_root, -1 if self.target else self.start), (self.ckpt_root, self.start)):
            gone = state.drop_after(root, after)
            if gone:
                self.log(f"removed {', '.join(d.name for d in gone)} from {root} (after step {after}; redone)")

    def count_flops(self, t: float) -> None:
        """The MFU counter, and the load's figures (``t``: when loading began)."""
        n_params = sum(p.numel() for p in self.model.parameters())
        peak, source = rl_metrics.peak_tflops(self.d.device, self.d.bf16, self.s.peak_tflops)
        self.flops = rl_metrics.Flops(rl_metrics.flop_params(self.model), self.world, peak)
        self.log(f"MFU = 6·N·tokens/s (+ 2·N·tokens/s through the reference) / (peak x {self.world} device(s)), "
                 f"N = {self.flops.n / 1e6:.1f}M, peak {f'{peak:g} TFLOP/s' if peak else 'none'}: {source}")
        self.log(f"model loaded in {time.perf_counter() - t:.1f}s ({n_params / 1e6:.1f}M parameters)")

    def start_publishing(self) -> None:
        """How weights leave the trainer: the publisher (not LoRA), to the run dir or by broadcast."""
        self.publisher = None if self.lora else Publisher(self.model, self.rank, self.world, self.publish_dtype,
                                                          self.log)
        if self.publisher is not None:
            self.send = FolderWriter(self.weights_root, self.publisher.snapshot, self.config, self.gen_config,
                                     self.model_dir, self.tok, self.keep, self.log).write
            self.log(f"weights published beside the next step, {len(self.publisher.layout.buckets)} bucket(s) of "
                     f"<= {self.publisher.layout.bucket_bytes / 2**20:.0f} MiB from a {self.publish_dtype} snapshot"
                     + ("" if self.flat_memory else "; host memory: no glibc mallopt here"))
        if self.target is None:
            return
        self.broadcaster = sender = self.target.connect(self.model, self.rank, self.publish_dtype, self.log,
                                                        self.publisher.snapshot if self.publisher else None)
        self.send = broadcast_work(sender, self.weights_root, self.keep, self.rank, STOP.is_set)
        if self.start:  # after a requeue: the servers take the checkpoint's weights before any rollout
            self.sync(self.start)
            self.log(f"servers on the weights of checkpoint {self.start} "
                     f"({self.wait_publish() or 0.0:.2f}s, {sender.bytes / 1e9:.3f} GB)")

    # ---- steps -----------------------------------------------------------------------
    def sft_step(self) -> dict:
        global_batch = self.s.global_batch
        dp_world, dp_rank = self.mesh.dp_world, self.mesh.dp_rank
        if global_batch % (dp_world * self.micro):
            raise SystemExit(f"slurmrl: trainer: batch {global_batch} does not split into micro_batch_size "
                             f"{self.micro} x {dp_world} data-parallel ranks")
        assert self.data is not None, "kind sft loads its dataset as the trainer starts"
        epoch = self.data.epoch
        packs = self.data.take(global_batch)
        n_tgt = max(1, int(sum(int(p.targets.sum()) for p in packs)))
        tokens = int(sum(int(p.used) for p in packs))
        per_rank = global_batch // dp_world
        mine = packs[dp_rank * per_rank : (dp_rank + 1) * per_rank]
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
        for whole in rollouts.split(samples, self.mesh.dp_rank, self.mesh.dp_world, self.micro, self.seq_len):
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
        experts = self.mesh.experts
        norm = (experts.grad_norm_and_clip(self.model, self.s.max_grad_norm) if experts is not None
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
                                     experts=self.mesh.experts, group=self.commit_group,
                                     grace_s=self.s.grace_seconds, stage=self.stage)
        self.deadline.save_took(time.perf_counter() - t)
        staged = ", staged: copied there in the background" if self.stage is not None else ""
        self.log(f"checkpoint ({why}) at {path} ({time.perf_counter() - t:.2f}s{staged})")

    # ---- main loop -------------------------------------------------------------------
    def run(self) -> int:
        self.setup()
        if self.start >= self.max_steps:
            self.log(f"already at step {self.start} of {self.max_steps}: nothing to do")
            return 0
        step = saved = self.start
        stopped = self.d.any(STOP.is_set())  # asked to stop while loading: nothing new to save
        # weights + AdamW's two moments: the first estimate of a save's size, until one is timed
        self.deadline = Deadline(job_end_from_env(),
                                 3 * sum(p.numel() * p.element_size() for p in self.model.parameters()))
        while step < self.max_steps and not stopped:
            if not self.train_step(step + 1):
                stopped = True  # asked to stop while waiting for the step's rollouts
                break
            step += 1
            stopped = self.d.any(STOP.is_set())
            if self.save_due(step, stopped):
                saved = step
        return self.finish(step, saved, stopped)

    def next_batch(self, n: int) -> tuple[float, RolloutBatch | None] | None:
        """RL: (seconds waited, step ``n``'s rollout batch); SFT: (0, None); None: every rank stops."""
        if self.kind != "rl":
            return 0.0, None
        path = steps.rollout_path(self.run_dir, n)
        waited = steps.wait_until(path.exists, STOP, self.log, str(path), poll=0.2)
        if self.d.any(waited is None):
            return None
        return waited or 0.0, rollouts.read_batch(path)

    def train_step(self, n: int) -> bool:
        """Step ``n``: its batch, forward and backward, the optimizer, its weights on their way, its metrics
        (and at the last step the final publish or merged model). False: stopped before it began."""
        heartbeat.beat()
        if self.publisher is not None:
            self.publisher.check()  # a failed background publish ends the trainer, named
        got = self.next_batch(n)
        if got is None:
            return False
        wait_s, batch = got
        rl_metrics.reset_peak(self.d.device)
        t = time.perf_counter()
        out = self.sft_step() if batch is None else self.rl_step(batch)
        norm = self.optimizer_step()
        if self.d.cuda:
            torch.cuda.synchronize()
        step_s = time.perf_counter() - t
        self.deadline.step_took(step_s)
        out.update(rl_metrics.memory(self.d.device))
        out.update(self.flops.record(out["tokens"], out.pop("ref_tokens", 0), step_s))
        if self.s.hybrid and self.d.cuda:  # the servers wake into what the trainer leaves: return cached blocks
            torch.cuda.empty_cache()
        sync_s = self.sync(n) if self.kind == "rl" else 0.0
        self.record(n, out, norm, step_s, wait_s, sync_s)
        if n == self.max_steps and self.kind == "sft":  # before the last checkpoint: DONE there means all done
            self.publish(n)
        if n == self.max_steps and self.lora:  # the merged model, also before the last checkpoint
            self.export_merged()
        return True

    def record(self, step: int, out: dict, norm: float, step_s: float, wait_s: float, sync_s: float) -> None:
        """Step ``step``'s metrics row and its log line."""
        lag = step - 1 - out["policy_step"] if self.kind == "rl" and isinstance(out.get("policy_step"), int) else None
        row = TrainerRow(step=step, kind=self.kind, **out, grad_norm=norm, lr=self.s.lr,
                         tokens_per_s=out["tokens"] / step_s if step_s > 0 else 0.0, step_time_s=step_s,
                         wait_s=wait_s, publish_s=0.0 if self.broadcaster else sync_s, sync_s=sync_s,
                         sync_background_s=self.publisher.previous_s if self.publisher else None,
                         sync_share=sync_s / (step_s + sync_s) if step_s + sync_s > 0 else 0.0,
                         time=time.time(), off_policy_lag=lag)
        self.metrics.log(row.to_json())
        if self.rank == 0 and step == self.start + 1:
            RunDir(self.run_dir).add_phase(RunDir.attempt_from_env(), f"first trainer step (step {step}, {step_s:.1f}s)")
        kl = "" if out.get("kl") is None else f" kl {out['kl']:.4f}"
        extra = (f"{kl} entropy {out['entropy']:.3f} clip {out['clip_frac']:.3f} "
                 f"reward {out['reward_mean']:.3f}" if self.kind == "rl" else "")
        self.log(f"step {step}/{self.max_steps} loss {out['loss']:.4f}{extra} grad_norm {norm:.3f} "
                 f"{row.tokens_per_s:.0f} tok/s step {step_s:.2f}s wait {wait_s:.2f}s")

    def save_due(self, step: int, stopped: bool) -> bool:
        """A checkpoint of ``step`` where one is due (stop asked, the last step, every ``checkpoint_every``
        steps, or early: the save the warning signal asks for might not fit before the time limit)."""
        early = not stopped and self.d.any(self.deadline.save_now())
        self.deadline.saved_early |= early
        if not (stopped or early or step % self.every == 0 or step == self.max_steps):
            return False
        self.wait_publish()  # a checkpoint of step n means READY for step n: a resume never waits for it
        why = ("stop requested" if stopped else "last step" if step == self.max_steps else
               "early: a save at the next step might not finish before the time limit" if early else "periodic")
        self.checkpoint(step, why)
        return True

    def finish(self, step: int, saved: int, stopped: bool) -> int:
        """After the last step run: the publish in flight, a checkpoint if a stop left one owed; the exit code."""
        self.wait_publish()
        if stopped and saved < step:
            self.checkpoint(step, "stop requested")
        if self.stage is not None:
            self.stage.wait(self.log)  # the last checkpoint's background copy (within the grace after a stop)
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
