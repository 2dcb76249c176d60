"""The fixed prose of the benchmark report (``docs/benchmarks.md``): its introduction
and how it measures."""

INTRO = (
    "tinymt's `Transformer` (our attention, `tinymt/attention.py`) against the same model "
    "built from `torch.nn.Transformer` (`tinymt/bench/peer.py`: same widths, heads, layers, FFN, "
    "vocabulary, dropout, pre-LN with final norms, batch-first, same scaled tied "
    "embeddings, sinusoidal positions and output projection -- the same parameter count, "
    "and the same weights in every comparison). "
    "Written by `scripts/benchmark.py` (the commands are at the end) with its raw numbers "
    "in `docs/benchmarks.json`; do not edit it by hand, rerun it.")

METHOD_BULLETS = (
    ("- **One process, same work.** For every size our model is built from the size's "
     "`configs/model/<size>.yaml`, the peer copies its weights "
     "(`PeerTransformer.load_from_ours`), and both train on the same pre-collated batches "
     "(tokens already on the device, so data loading is not timed) with the same AdamW "
     "(lr 1e-4, betas 0.9/0.98, fused on CUDA), label-smoothed (0.1) cross-entropy and "
     "grad-norm clipping at 1.0. Runs alternate ours, plain, peer, ours, … so that thermal "
     "or background drift hits all; each run re-does its warm-up steps; the median run "
     "is reported."),
    ("- **The CPU training step** (#36). `torch.profiler` of a `small` step on Multi30k "
     "batches, 2 threads, before: matmuls 59 % of the time, dropout's `bernoulli_` 13 %, "
     "attention (SDPA) 6 %, `log_softmax` forward and backward over the (tokens × 8,000) "
     "logits 5 %, copies and fills 3 %. Three changes: `layers.Dropout` draws its CPU mask "
     "from 16 random bits per element (3× cheaper than `bernoulli_` with its backward); "
     "`loss.linear_cross_entropy` computes the output projection, the loss and their "
     "gradients in chunks of 512 rows on the real targets only, without the logits tensor "
     "(whose fresh 130 MB pages cost as much as the matmul into them): each chunk's logits "
     "go into one reused buffer, then a row-wise `log_softmax` and `exp_`, and the label "
     "smoothing's uniform part is added to both gradients as rank-one terms (three passes "
     "over a chunk's logits, not nine; about 10 % of the step, commit 7b530af); the "
     "token-budget sampler sorts by the longer side first (6 % fewer batches an epoch, "
     "target padding 4.9 % instead of 11.6 %). The *plain* column shares the new batches, "
     "so it shows the step's gain only. `torch.compile` of the step on this CPU was slower "
     "(251 against 366 tok/s, 292 s of warm-up, recompiles on every new batch shape) and is "
     "not used."),
    ("- **Throughput** counts target tokens (`tgt_out` without padding) of the timed steps "
     "divided by their wall time (`time.perf_counter`, after `torch.cuda.synchronize` on "
     "GPU)."),
    ("- **Decoding**: ours with the KV cache (`greedy_decode` / `beam_search`, "
     "`use_cache=True`), ours re-running the decoder on the whole prefix each step "
     "(`use_cache=False`), and the peer, driven by the same `tinymt.decoding.greedy_decode` "
     "/ `beam_search` with `use_cache=False` (it has no cache): the usual `nn.Transformer` "
     "recipe, recompute the whole prefix each step and project only the last position. "
     "Finished sentences leave the batch in every method. "
     "Sentences/s = test sentences ÷ wall time of one pass over all batches (encoder "
     "included)."),
    ("- **CTranslate2** (with `--run` and the `ct2` extra installed): the run's checkpoint "
     "exported with `tinymt.ct2.export_run` (float32, and int8 weights) into a temporary "
     "folder and decoded through `tinymt.ct2.translate_export_ids` -- the code of "
     "`translate.py engine=ct2` -- with the same length rule, on as many intra-op threads as "
     "torch uses, pass by pass in a child process, alternating with the other methods "
     "(CTranslate2's and torch's thread pools in one process slow each other down by about "
     "15%); CTranslate2 batches the sentences itself."),
)
PRECISION_BULLET = (
    "- **Precision**: fp32 on CPU; bf16 autocast for both models on CUDA (ours then uses "
    "`scaled_dot_product_attention`'s fused kernels, the peer `nn.MultiheadAttention`), "
    "`torch.set_float32_matmul_precision('high')`.")
