"""Training: ``train(cfg) -> metrics``, readable top to bottom.

1. set up the device / ranks, the run dir and the data (tokenizer, batches)
2. build the model, optimizer and schedule; restore everything on resume
3. loop: token-budget batches -> loss -> backward -> clip -> step, logging scalars
4. every ``valid_every`` steps: loss / ppl / BLEU / chrF, attention maps and entropy to
   TensorBoard, ``last.pt`` (+ ``best.pt`` on a BLEU gain), early stopping
5. at the end: test BLEU with the best checkpoint, ``metrics.json``, hparams

Run dir layout::

    <run_dir>/config.yaml        resolved config
    <run_dir>/tokenizer/         sentencepiece model(s)
    <run_dir>/checkpoints/       last.pt, best.pt, ckpt_<step>.pt, avg.pt
    <run_dir>/events.out.tfevents.*   TensorBoard (scalars, attention maps, samples, hparams)
    <run_dir>/metrics.json       final numbers
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams
from tqdm import tqdm

from tinymt import runtime
from tinymt.attention_maps import attention_figures, collect_attention
from tinymt.batching import TokenBatchSampler, collate, eval_batches
from tinymt.checkpoint import average_checkpoints, load_checkpoint, save_checkpoint
from tinymt.config import TrainConfig, check_choices
from tinymt.corpus import SHOWCASE
from tinymt.data import PreparedData, normalize, prepare, target_language
from tinymt.decoding import translate_ids
from tinymt.errors import TinyMTError
from tinymt.metrics import attention_entropy, score, token_nll
from tinymt.model import KINDS, Transformer, count_parameters
from tinymt.plotting import figure_to_array
from tinymt.rundir import step_checkpoints
from tinymt.tokenizer import save_tokenizers


# ----------------------------------------------------------------------------- config
def as_config(cfg) -> DictConfig:
    """Merge a dict / DictConfig onto the typed schema (unknown keys are errors)."""
    schema = OmegaConf.structured(TrainConfig)
    try:
        merged = OmegaConf.merge(schema, cfg)
    except Exception as e:  # omegaconf's ValidationError / ConfigKeyError
        raise TinyMTError(f"bad config: {e}".splitlines()[0]) from None
    check_choices(merged)
    return merged


def resume_config(cfg: DictConfig, overrides: list[str] = ()) -> DictConfig:
    """The config of the run being resumed, plus this command's overrides."""
    run_dir = Path(cfg.trainer.resume)
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise TinyMTError(f"cannot resume: {saved} not found (is {run_dir} a tinymt run dir?)")
    merged = as_config(OmegaConf.load(saved))
    merged = OmegaConf.merge(merged, OmegaConf.from_dotlist(
        [o for o in overrides if not o.startswith(("trainer.resume=", "run_dir="))]))
    merged.trainer.resume = str(run_dir)
    merged.run_dir = str(run_dir)
    return merged


def lr_factor(step: int, warmup: int, schedule: str, max_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (1-based)."""
    step = max(step, 1)
    if warmup > 0 and step <= warmup:
        return step / warmup
    if schedule == "inverse_sqrt":
        return math.sqrt(max(warmup, 1) / step)
    if schedule == "cosine":
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "constant":
        return 1.0
    raise TinyMTError(f"optim.schedule={schedule!r}: use inverse_sqrt, cosine or constant")


def build_model(cfg: DictConfig, data: PreparedData) -> Transformer:
    shared = data.src_tokenizer is data.tgt_tokenizer
    longest = max((n for side in data.lengths("train") for n in side), default=0)
    if longest + 1 > cfg.model.max_positions:
        raise TinyMTError(
            f"training pairs of up to {longest} tokens (+1 for bos/eos) do not fit "
            f"model.max_positions={cfg.model.max_positions}: lower data.max_len to "
            f"{cfg.model.max_positions - 1} or raise model.max_positions")
    return Transformer(cfg.model, data.src_tokenizer.vocab_size, data.tgt_tokenizer.vocab_size,
                       shared_vocab=shared)


# ----------------------------------------------------------------------------- train
def train(cfg) -> dict:
    cfg = as_config(cfg)
    tc = cfg.trainer
    rt = runtime.setup(tc.device, tc.precision, tc.num_threads)
    try:
        return _train(cfg, rt)
    finally:
        runtime.teardown(rt)


def _train(cfg: DictConfig, rt: runtime.Runtime) -> dict:
    tc, oc = cfg.trainer, cfg.optim
    t_start = time.time()
    log = print if rt.is_main else (lambda *a, **k: None)

    # 1. run dir, data --------------------------------------------------------------
    run_dir = Path(cfg.run_dir or f"outputs/{time.strftime('%Y-%m-%d/%H-%M-%S')}")
    run_dir = Path(runtime.broadcast_object(rt, str(run_dir)))  # every rank uses rank 0's
    if rt.distributed:
        _check_same_config(cfg, rt)
    ckpt_dir = run_dir / "checkpoints"
    resuming = bool(tc.resume)
    if resuming and not (ckpt_dir / "last.pt").is_file():
        raise TinyMTError(f"cannot resume: {ckpt_dir / 'last.pt'} not found")
    if rt.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, run_dir / "config.yaml")
    runtime.seed_everything(tc.seed)

    if rt.is_main:  # rank 0 builds the cache, the others then read it
        data = prepare(cfg.data, log=log)
    runtime.barrier(rt)
    if not rt.is_main:
        data = prepare(cfg.data, log=log)
    if rt.is_main:
        save_tokenizers(run_dir / "tokenizer", data.src_tokenizer, data.tgt_tokenizer)
    train_src, train_tgt = data.ids("train")  # plain lists: fast to index every step
    pad = data.tgt_tokenizer.pad_id

    # 2. model, optimizer, schedule ---------------------------------------------------
    model = build_model(cfg, data).to(rt.device)
    log(f"model: {cfg.model.name}, {count_parameters(model):,} parameters "
        f"(d_model={cfg.model.d_model}, heads={cfg.model.n_heads}, "
        f"layers={cfg.model.n_encoder_layers}+{cfg.model.n_decoder_layers}); device {rt.device}"
        + (f", {rt.world_size} processes" if rt.distributed else ""))
    fused = oc.fused and rt.device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=oc.lr, betas=tuple(oc.betas),
                                  eps=oc.eps, weight_decay=oc.weight_decay, fused=fused or None)
    min_ratio = oc.min_lr / oc.lr if oc.lr > 0 else 0.0
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_factor(s + 1, oc.warmup_steps, oc.schedule, tc.max_steps, min_ratio))
    sampler = TokenBatchSampler(*data.lengths("train"), max_tokens=tc.max_tokens, seed=tc.seed,
                                shuffle=True)
    state = {"step": 0, "epoch": 0, "best_bleu": -1.0, "bad_validations": 0,
             "train_seconds": 0.0, "skipped_steps": 0}

    if resuming:
        ckpt = load_checkpoint(ckpt_dir / "last.pt", map_location=rt.device)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        sampler.load_state_dict(ckpt["sampler"])
        state.update(ckpt["trainer_state"])
        _set_rng_state(ckpt["rng"], rt)
        log(f"resumed {run_dir} at step {state['step']} (epoch {state['epoch']})")
    else:
        sampler.set_epoch(0)

    train_model = model
    if tc.compile:
        train_model = torch.compile(model)
    if rt.distributed:
        train_model = torch.nn.parallel.DistributedDataParallel(
            train_model, device_ids=[rt.device.index] if rt.device.type == "cuda" else None)

    writer = None
    if rt.is_main:
        # purge_step drops events a killed run wrote after its last checkpoint
        writer = SummaryWriter(str(run_dir), purge_step=state["step"] + 1 if resuming else None)
        writer.add_text("config", "```\n" + OmegaConf.to_yaml(cfg) + "\n```", state["step"])

    probes = _probe_sentences(cfg, data)

    # 3. the loop ------------------------------------------------------------------------
    def next_batches():
        """Global batches forever, epoch after epoch; the sampler remembers where it is."""
        while True:
            yield from sampler
            state["epoch"] += 1
            sampler.set_epoch(state["epoch"])

    batches = next_batches()
    bar = tqdm(total=tc.max_steps, initial=state["step"], disable=not rt.is_main,
               desc="train", dynamic_ncols=True, mininterval=1.0)
    window = {"loss": 0.0, "tokens": 0, "seconds": 0.0, "steps": 0}
    stop_reason = "max_steps"
    budget_s = tc.max_minutes * 60 if tc.max_minutes > 0 else math.inf
    consecutive_skips = 0
    model.train()
    while state["step"] < tc.max_steps:
        if state["epoch"] >= tc.max_epochs:
            stop_reason = "max_epochs"
            break
        if state["train_seconds"] >= budget_s:
            stop_reason = "max_minutes"
            break
        t0 = time.time()
        micro = [next(batches) for _ in range(tc.accumulate)]
        # every rank knows the whole global batch, so the token count needs no collective
        n_tokens = sum(len(train_tgt[i]) + 1 for idx in micro for i in idx)
        step_loss = 0.0
        optimizer.zero_grad(set_to_none=True)
        for k, indices in enumerate(micro):
            mine = indices[rt.rank::rt.world_size]  # this rank's share of the global batch
            if not mine:
                mine, weight = indices[:1], 0.0  # too few sentences to split: stay in step
            else:
                weight = 1.0
            batch = collate([train_src[i] for i in mine], [train_tgt[i] for i in mine]).to(
                rt.device)
            sync = k == len(micro) - 1 or not rt.distributed
            ctx = train_model.no_sync() if (rt.distributed and not sync) else contextlib.nullcontext()
            with ctx, rt.autocast():
                logits, _ = train_model(batch.src, batch.tgt_in)
                loss_sum = token_nll(logits, batch.tgt_out, pad, oc.label_smoothing)
                # DDP averages gradients over ranks; scale so the result is sum / n_tokens
                loss = loss_sum * (weight * rt.world_size / n_tokens)
            loss.backward()
            step_loss += loss_sum.item() * weight
        step_loss = runtime.all_reduce_sum(rt, [step_loss])[0] / n_tokens

        if not math.isfinite(step_loss):
            if tc.nan_policy == "skip" and consecutive_skips < 10:
                state["skipped_steps"] += 1
                consecutive_skips += 1
                log(f"\nwarning: non-finite loss ({step_loss}) at step {state['step'] + 1}: "
                    "step skipped")
                optimizer.zero_grad(set_to_none=True)
                continue
            if tc.nan_policy == "skip":
                raise TinyMTError(f"loss non-finite for 10 batches in a row at step "
                                  f"{state['step'] + 1}; lower optim.lr")
            raise TinyMTError(
                f"loss became {step_loss} at step {state['step'] + 1}; the last checkpoint is "
                f"intact. Lower optim.lr or set trainer.nan_policy=skip")
        if oc.clip_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), oc.clip_grad_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
        consecutive_skips = 0
        optimizer.step()
        scheduler.step()
        state["step"] += 1
        dt = time.time() - t0
        state["train_seconds"] += dt
        window["loss"] += step_loss
        window["tokens"] += n_tokens
        window["seconds"] += dt
        window["steps"] += 1
        step = state["step"]
        lr = scheduler.get_last_lr()[0]
        bar.update(1)

        if step % tc.log_every == 0 or step == tc.max_steps:
            tok_s = window["tokens"] / max(window["seconds"], 1e-9)
            avg = window["loss"] / window["steps"]
            bar.set_postfix(loss=f"{avg:.3f}", lr=f"{lr:.2e}", tok_s=f"{tok_s:,.0f}")
            if writer:
                writer.add_scalar("train/loss", avg, step)
                writer.add_scalar("train/lr", lr, step)
                writer.add_scalar("train/grad_norm", float(grad_norm), step)
                writer.add_scalar("train/tokens_per_s", tok_s, step)
                writer.add_scalar("train/epoch", state["epoch"], step)
            window = {"loss": 0.0, "tokens": 0, "seconds": 0.0, "steps": 0}

        # 4. validation + checkpoints ----------------------------------------------------
        last_step = step == tc.max_steps or state["train_seconds"] >= budget_s
        if step % tc.valid_every == 0 or last_step:
            metrics = validate(model, cfg, data, "valid", rt, limit=tc.valid_sentences)
            improved = metrics["bleu"] > state["best_bleu"]
            if improved:
                state["best_bleu"] = metrics["bleu"]
                state["bad_validations"] = 0
            else:
                state["bad_validations"] += 1
            if rt.is_main:
                bar.write(f"step {step:>6} | epoch {state['epoch']} | valid loss "
                          f"{metrics['loss']:.3f} ppl {metrics['ppl']:.2f} | BLEU "
                          f"{metrics['bleu']:.2f} chrF {metrics['chrf']:.2f}"
                          + (" *" if improved else ""))
                _log_validation(writer, model, cfg, data, metrics, probes, rt, step)
                ckpt = _checkpoint_state(model, optimizer, scheduler, sampler, state, cfg, data)
                save_checkpoint(ckpt, ckpt_dir / "last.pt")
                if improved:
                    save_checkpoint(ckpt, ckpt_dir / "best.pt")
                if tc.keep_last > 1:
                    save_checkpoint(ckpt, ckpt_dir / f"ckpt_{step}.pt")
                    for old in step_checkpoints(run_dir)[:-tc.keep_last]:
                        old.unlink()
                writer.flush()
            runtime.barrier(rt)
            if tc.patience and state["bad_validations"] >= tc.patience:
                stop_reason = f"no BLEU gain in {tc.patience} validations"
                break
            model.train()
    bar.close()

    # 5. final: best checkpoint on the test set -------------------------------------------
    if not (ckpt_dir / "best.pt").is_file():  # e.g. stopped before the first validation
        validate_and_save = validate(model, cfg, data, "valid", rt, limit=tc.valid_sentences)
        state["best_bleu"] = validate_and_save["bleu"]
        if rt.is_main:
            ckpt = _checkpoint_state(model, optimizer, scheduler, sampler, state, cfg, data)
            save_checkpoint(ckpt, ckpt_dir / "last.pt")
            save_checkpoint(ckpt, ckpt_dir / "best.pt")
        runtime.barrier(rt)
    final_ckpt = ckpt_dir / "best.pt"
    if tc.average_last > 1:
        steps = step_checkpoints(run_dir)[-tc.average_last:]
        if len(steps) > 1 and rt.is_main:
            save_checkpoint(average_checkpoints(steps), ckpt_dir / "avg.pt")
        runtime.barrier(rt)
        if len(steps) > 1:
            final_ckpt = ckpt_dir / "avg.pt"
    model.load_state_dict(load_checkpoint(final_ckpt, map_location=rt.device)["model"])
    test = validate(model, cfg, data, "test", rt, beam=tc.test_beam, with_loss=True)
    wall = time.time() - t_start
    metrics = {
        "best_valid_bleu": state["best_bleu"],
        "test_bleu": test["bleu"],
        "test_chrf": test["chrf"],
        "test_loss": test["loss"],
        "bleu_signature": test["signature"],
        "test_beam": tc.test_beam,
        "test_checkpoint": final_ckpt.name,
        "steps": state["step"],
        "epochs": state["epoch"],
        "train_seconds": round(state["train_seconds"], 1),
        "wall_seconds": round(wall, 1),
        "stop_reason": stop_reason,
        "parameters": count_parameters(model),
        "run_dir": str(run_dir),
    }
    if rt.is_main:
        (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        writer.add_scalar("test/bleu", test["bleu"], state["step"])
        writer.add_scalar("test/chrf", test["chrf"], state["step"])
        _log_hparams(writer, cfg, metrics)
        writer.close()
        print(
            f"\ndone in {wall / 60:.1f} min ({stop_reason}): best valid BLEU "
            f"{state['best_bleu']:.2f}, test BLEU {test['bleu']:.2f} chrF {test['chrf']:.2f} "
            f"(beam {tc.test_beam}, {final_ckpt.name})\n"
            f"  {test['signature']}\n"
            f"  run dir: {run_dir}\n"
            f"  translate: python scripts/translate.py run={run_dir} \"<sentence>\"\n"
            f"  watch:     tensorboard --logdir {run_dir}"
        )
    return metrics


# ----------------------------------------------------------------------------- validation
@torch.inference_mode()
def validate(model, cfg, data: PreparedData, split: str, rt: runtime.Runtime, limit: int = 0,
             beam: int = 1, with_loss: bool = True) -> dict:
    """Teacher-forced loss/ppl on the whole split, BLEU/chrF of translations of ``limit``."""
    model.eval()
    ds = data.splits[split]
    limit_len = cfg.model.max_positions - 1  # valid/test are never length-filtered: clip
    src_ids, tgt_ids = ([x[:limit_len] for x in side] for side in data.ids(split))
    n = len(src_ids)
    loss_sum = tok = 0.0
    if with_loss:
        batches = eval_batches(src_ids, tgt_ids, cfg.trainer.max_tokens)
        for _, batch in batches[rt.rank::rt.world_size]:  # each rank a share of the batches
            batch = batch.to(rt.device)
            with rt.autocast():
                logits, _ = model(batch.src, batch.tgt_in)
            loss_sum += token_nll(logits, batch.tgt_out, data.tgt_tokenizer.pad_id).item()
            tok += batch.n_tgt_tokens
        loss_sum, tok = runtime.all_reduce_sum(rt, [loss_sum, tok])
    keep = list(range(n if not limit else min(limit, n)))
    mine = keep[rt.rank::rt.world_size]
    with rt.autocast():
        outs = translate_ids(model, [src_ids[i] for i in mine], beam=beam,
                             max_len_a=1.5, max_len_b=cfg.trainer.valid_max_len_b,
                             device=rt.device, batch_tokens=cfg.trainer.max_tokens)
    hyps_mine = [data.tgt_tokenizer.decode(o[0][0]) for o in outs]
    gathered = runtime.all_gather_objects(rt, list(zip(mine, hyps_mine)))
    by_index = dict(pair for part in gathered for pair in part)
    hyps = [by_index[i] for i in keep]
    tgt_text, src_text = ds["tgt"][:], ds["src"][:]
    refs = [tgt_text[i] for i in keep]
    bleu, chrf, sig = score(hyps, refs, target_language(cfg.data))
    loss = loss_sum / max(tok, 1) if with_loss else float("nan")
    return {"loss": loss, "ppl": math.exp(min(loss, 50)), "bleu": bleu, "chrf": chrf,
            "signature": sig, "hyps": hyps, "refs": refs, "srcs": [src_text[i] for i in keep]}


def _check_same_config(cfg, rt) -> None:
    """torchrun ranks must agree on everything but where they were told to write."""
    mine = OmegaConf.to_container(cfg)
    mine.pop("run_dir", None)
    digest = hashlib.sha256(json.dumps(mine, sort_keys=True).encode()).hexdigest()
    digests = runtime.all_gather_objects(rt, digest)
    if len(set(digests)) > 1:
        bad = [r for r, d in enumerate(digests) if d != digests[0]]
        raise TinyMTError(f"ranks {bad} were started with a different config than rank 0: "
                          "give every process the same overrides")


def _probe_sentences(cfg, data: PreparedData) -> list[str]:
    """Sentences whose attention maps are drawn at every validation."""
    probes = list(cfg.trainer.probe_sentences)
    if cfg.data.source == "builtin" and not cfg.data.reverse:
        probes += [pair.zh for pair in SHOWCASE]
    probes += list(data.splits["valid"]["src"][: cfg.trainer.n_probes])
    return probes


def _log_validation(writer, model, cfg, data, metrics, probes, rt, step):
    writer.add_scalar("valid/loss", metrics["loss"], step)
    writer.add_scalar("valid/ppl", metrics["ppl"], step)
    writer.add_scalar("valid/bleu", metrics["bleu"], step)
    writer.add_scalar("valid/chrf", metrics["chrf"], step)
    k = cfg.trainer.n_text_samples
    rows = ["| source | reference | hypothesis |", "| --- | --- | --- |"]
    rows += [f"| {s} | {r} | {h} |" for s, r, h in
             zip(metrics["srcs"][:k], metrics["refs"][:k], metrics["hyps"][:k])]
    writer.add_text("samples", "\n".join(rows), step)

    # attention maps of the probes, and each head's mean entropy over them
    src_tok, tgt_tok = data.src_tokenizer, data.tgt_tokenizer
    entropy: dict[tuple[str, int], list[np.ndarray]] = {}
    for p, sentence in enumerate(probes):
        ids = src_tok.encode(normalize(sentence))[: cfg.model.max_positions - 1]
        out = translate_ids(model, [ids], beam=1, device=rt.device,
                            max_len_b=cfg.trainer.valid_max_len_b)[0][0][0]
        attn = collect_attention(model, ids, out, rt.device)
        for tag, fig in attention_figures(attn, src_tok, tgt_tok, ids, out,
                                          kinds=KINDS,
                                          title=sentence):
            kind, layer = tag.split("/")
            writer.add_image(f"attention/{kind}/{layer}/probe_{p}", figure_to_array(fig), step,
                             dataformats="HWC")
        for kind, layers in attn.items():
            for layer, w in enumerate(layers):  # w: (h, Tq, Tk)
                ent = attention_entropy(w).mean(-1)  # (h,)
                entropy.setdefault((kind, layer), []).append(ent)
        writer.add_text(f"attention/probe_{p}",
                        f"{sentence}  \n→ {tgt_tok.decode(out)}", step)
    for (kind, layer), ents in entropy.items():
        for h, e in enumerate(np.mean(ents, axis=0)):
            writer.add_scalar(f"attention_entropy/{kind}/layer_{layer}/head_{h}", float(e), step)


def _log_hparams(writer, cfg, metrics):
    hp = {}
    for group in ("data", "model", "optim", "trainer"):
        for k, v in OmegaConf.to_container(cfg[group]).items():
            if isinstance(v, (int, float, str, bool)):
                hp[f"{group}.{k}"] = v
    m = {"hparam/test_bleu": metrics["test_bleu"], "hparam/best_valid_bleu":
         metrics["best_valid_bleu"], "hparam/test_chrf": metrics["test_chrf"]}
    exp, ssi, sei = hparams(hp, m)
    fw = writer._get_file_writer()
    for s in (exp, ssi, sei):
        fw.add_summary(s)
    for k, v in m.items():
        writer.add_scalar(k, v, metrics["steps"])


# ----------------------------------------------------------------------------- state
def _checkpoint_state(model, optimizer, scheduler, sampler, state, cfg, data) -> dict:
    return {
        "model": model.state_dict(),
        "model_config": OmegaConf.to_container(cfg.model),
        "vocab": {"src_size": data.src_tokenizer.vocab_size,
                  "tgt_size": data.tgt_tokenizer.vocab_size,
                  "shared": data.src_tokenizer is data.tgt_tokenizer},
        "config": OmegaConf.to_container(cfg),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "sampler": sampler.state_dict(),
        "trainer_state": dict(state),
        "rng": {
            "python": random.getstate(),
            "numpy": _numpy_rng_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        },
        "step": state["step"],
    }


def _numpy_rng_state() -> tuple:
    """numpy's global RNG state with its key array as a tensor (checkpoints hold tensors
    and plain containers only)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return (name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
            float(gauss))


def _set_rng_state(rng: dict, rt) -> None:
    random.setstate(rng["python"])
    name, keys, pos, has_gauss, gauss = rng["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(rng["torch"].cpu())
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])

