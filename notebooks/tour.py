# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Multi-head attention, step by step, on a trained model
#
# The tutorials this project was built from explain multi-head attention as *a team of
# eight small brains, each looking at a different relation*, write it in numpy and as a
# PyTorch class, and use one example sentence: **我请李雷帮我订了去北京的机票。**
# ("I asked Li Lei to help me book a ticket to Beijing."). This notebook follows that
# sentence through a trained tinymt model:
#
# 1. the tokenizer: pieces, ids, embeddings + positions;
# 2. one encoder self-attention layer **by hand** (queries, keys, values, heads, scores,
#    the padding mask, softmax, weighted sum, concatenation, $W_O$), checked against the
#    model's own `MultiHeadAttention`;
# 3. the decoder's masked (causal) self-attention, and cross-attention;
# 4. every head's attention map, and what the head analysis finds;
# 5. one head switched off, and the translation that changes.
#
# Run it top to bottom (*Run → Run All Cells*) after `make demo`: it uses the newest run
# under `outputs/` (like `run=latest`). Without one, it first trains the tiny model for
# about a minute.
#
# ---
#
# # 多头注意力，一步一步：在训练好的模型上
#
# 本项目所依据的教程把多头注意力比作“一个由八个小脑袋组成的团队，每个小脑袋关注一种不同的关系”，
# 先用 numpy 实现，再写成 PyTorch 类，并用同一个例句：**我请李雷帮我订了去北京的机票。**
# 本笔记本让这个句子走过一个训练好的 tinymt 模型：
#
# 1. 分词器：子词（piece）、编号（id）、词嵌入 + 位置编码；
# 2. **手写**一层编码器自注意力（查询/键/值、拆分成多个头、打分、填充掩码、softmax、加权求和、
#    拼接、$W_O$），并与模型自己的 `MultiHeadAttention` 逐项对比；
# 3. 解码器的掩码（因果）自注意力，以及交叉注意力；
# 4. 每个头的注意力图，以及头分析的结论；
# 5. 关掉一个头，看译文如何改变。
#
# 先运行 `make demo`，再从头到尾运行本笔记本（*Run → Run All Cells*）：它使用 `outputs/`
# 下最新的训练结果（等同于 `run=latest`）。如果还没有，它会先花大约一分钟训练一个小模型。

# %%
# About this file: the tour lives in git as a jupytext "percent" script (notebooks/tour.py),
# not as an .ipynb: plain Python with readable diffs, no outputs or execution counts to
# strip, linted by ruff and executed by tests/test_tour.py. `make tour` pairs it with
# notebooks/tour.ipynb (git-ignored) and opens that in Jupyter; saving there updates this file.
import html
import io
import math
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch
from hydra import compose, initialize_config_dir
from IPython.display import HTML, Image, display

from tinymt import KINDS
from tinymt.attention_maps import attention_figures, collect_attention
from tinymt.batching import collate
from tinymt.data import normalize
from tinymt.decoding import translate_ids
from tinymt.errors import TinyMTError
from tinymt.heads import (
    alignment_summary,
    all_heads,
    attention_pass,
    gates_without,
    head_importance,
    head_labels,
    load_sentences,
    normalize_importance,
    relation_summary,
)
from tinymt.heads.gates import gated_heads
from tinymt.model import causal_mask
from tinymt.rundir import checkpoint_path, clock_run_dir, find_run, load_run
from tinymt.trainer import train
from tinymt.viewer.document import translation_document
from tinymt.viewer.html import html_page


def checkout_root() -> Path:
    """The tinymt checkout: the current folder or one above it holding configs/train.yaml."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "configs" / "train.yaml").is_file():
            return folder
    raise TinyMTError(f"{Path.cwd()} is not inside a tinymt checkout (no configs/train.yaml): "
                      "open the tour from the repository (make tour)")


ROOT = checkout_root()
os.chdir(ROOT)  # run configs name paths relative to the checkout (outputs/.cache), as scripts do


def train_tiny_model() -> Path:
    """Train the default tiny model for 400 steps (about a minute) into outputs/tour/<date>/<time>."""
    with initialize_config_dir(version_base="1.3", config_dir=str(ROOT / "configs")):
        cfg = compose(config_name="train", overrides=[
            f"run_dir={clock_run_dir('outputs/tour')}",
            "trainer.max_steps=400",  # about a minute on 2 CPU cores
            "trainer.valid_every=100000",  # validate once, at the end
            "trainer.valid_sentences=100", "trainer.test_beam=1",
        ])
    return Path(train(cfg, unique_run_dir=True)["run_dir"])


def pick_run() -> Path:
    """$TINYMT_TOUR_RUN, else the newest run under outputs/, else a freshly trained one."""
    if os.environ.get("TINYMT_TOUR_RUN"):
        named = Path(os.environ["TINYMT_TOUR_RUN"])
        if not any(checkpoint_path(named, c).is_file() for c in ("best", "last")):
            raise TinyMTError(f"TINYMT_TOUR_RUN={named}: no checkpoints/best.pt or last.pt "
                              "there; name a run dir written by scripts/train.py")
        return named
    try:
        return find_run("latest")
    except TinyMTError:
        print("No trained run under outputs/ (make demo trains one): training the tiny model "
              "for about a minute first ...")
        return train_tiny_model()


run_dir = pick_run()
checkpoint = "best" if checkpoint_path(run_dir, "best").is_file() else "last"
run = load_run(str(run_dir), checkpoint, device="cpu")
model, src_tok, tgt_tok = run.model, run.src_tokenizer, run.tgt_tokenizer  # model is in eval mode
torch.set_grad_enabled(False)  # we only look (head_importance turns gradients on for itself)
print(f"run: {run.run_dir} ({run.checkpoint.name})")
print(f"model: d_model={model.d_model}, heads={model.n_heads}, "
      f"layers={len(model.encoder_layers)}+{len(model.decoder_layers)}, "
      f"{'pre' if model.encoder_layers[0].norm_first else 'post'}-LN")


def show(fig) -> None:
    """Display a matplotlib figure as a PNG (works in Jupyter and in executed notebooks)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    display(Image(buf.getvalue()))


# %% [markdown]
# ## 1. From characters to vectors
#
# The source text is normalised as in training (Unicode NFKC), cut into sentencepiece
# pieces, and each piece becomes an id. `collate` appends `</s>` (id 3) and pads with
# `<pad>` (id 0) on the right, so that a **shorter sentence** fits in the same batch; the
# padding mask is `True` on padding. Each id picks a row of the embedding matrix (scaled by
# $\sqrt{d_{model}}$), and a position vector is added: the input of the first encoder
# layer, shape `(B, S, d_model)`.
#
# ## 1. 从字到向量
#
# 源句先像训练时一样做规范化（Unicode NFKC），再切成 sentencepiece 子词，每个子词对应一个编号。
# `collate` 在句末加上 `</s>`（编号 3），并在右边用 `<pad>`（编号 0）填充，这样**较短的句子**
# 也能放进同一个批次；填充掩码在填充位置为 `True`。每个编号取出词嵌入矩阵的一行（乘以
# $\sqrt{d_{model}}$），再加上位置向量，就得到第一层编码器的输入，形状为 `(B, S, d_model)`。

# %%
SENTENCE = "我请李雷帮我订了去北京的机票。"  # the tutorials' example
SHORT = "他喜欢猫吗？"  # shorter: its row of the batch is padded

src_ids = src_tok.encode(normalize(SENTENCE))
short_ids = src_tok.encode(normalize(SHORT))
print("pieces:", src_tok.pieces(src_ids))
print("ids:   ", src_ids)

batch = collate([src_ids, short_ids], [[], []])  # targets unused here
src, pad_mask = batch.src, batch.src_pad_mask  # (B, S) ids + </s>, (B, S) True on padding
B, S = src.shape
print("\nsrc (B, S) =", tuple(src.shape))
print(src)
print("padding mask (1 = padding):")
print(pad_mask.int())

tok = model.src_embed(src) * model.embed_scale  # (B, S, d) token embeddings * sqrt(d)
pos = model.src_pos(S)  # (S, d) one vector per position
x = tok + pos  # (B, S, d) the encoder's input (dropout is off in eval mode)
print(f"\nembeddings {tuple(tok.shape)} + positions {tuple(pos.shape)} = x {tuple(x.shape)}")

# %% [markdown]
# ## 2. One encoder self-attention layer, by hand
#
# In self-attention every position asks (**query**) and every position answers (**key**
# to be matched, **value** to be passed on). The model keeps $W_Q, W_K, W_V$ stacked in one
# matrix, `in_proj.weight = [W_Q; W_K; W_V]`, and $W_O$ in `out_proj`. With $h$ heads of
# $d_{head} = d_{model} / h$ dimensions each, for every head:
#
# $$\mathrm{head}_i = \mathrm{softmax}\!\left(\frac{Q_i K_i^\top}{\sqrt{d_{head}}} + M\right) V_i,
# \qquad \mathrm{MHA}(x) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W_O$$
#
# where the mask $M$ is $-\infty$ on padding keys, so no real word looks at padding. The
# cell below writes this out in plain torch and then **asserts** that it equals the
# output (and the weights) of the model's own `MultiHeadAttention` on the same input;
# the notebook stops here if they differ.
#
# ## 2. 手写一层编码器自注意力
#
# 在自注意力中，每个位置既提出**查询**（query），也提供**键**（key，被查询匹配）和**值**
# （value，被加权传递）。模型把 $W_Q, W_K, W_V$ 叠放在一个矩阵里：
# `in_proj.weight = [W_Q; W_K; W_V]`，$W_O$ 在 `out_proj` 中。有 $h$ 个头，每个头
# $d_{head} = d_{model} / h$ 维，每个头计算上面的公式，其中掩码 $M$ 在填充的键上为
# $-\infty$，所以真实的词不会关注填充位置。下面的单元格用几行 torch 写出整个多头注意力，
# 然后**断言**它与模型自己的 `MultiHeadAttention` 在同一输入上的输出（以及注意力权重）
# 相同；如果不同，笔记本会在这里停下。

# %%
layer = model.encoder_layers[0]
mha = layer.self_attn  # tinymt.attention.MultiHeadAttention
x_in = layer.norm1(x) if layer.norm_first else x  # what the layer feeds its attention
d, h = mha.d_model, mha.n_heads
d_head = d // h
W_Q, W_K, W_V = mha.in_proj.weight.split(d)  # each (d, d)
b_Q, b_K, b_V = mha.in_proj.bias.split(d)  # each (d,)
W_O, b_O = mha.out_proj.weight, mha.out_proj.bias  # (d, d), (d,)

Q = x_in @ W_Q.T + b_Q  # (B, S, d) queries
K = x_in @ W_K.T + b_K  # (B, S, d) keys
V = x_in @ W_V.T + b_V  # (B, S, d) values
Q = Q.view(B, S, h, d_head).transpose(1, 2)  # (B, h, S, d_head)
K = K.view(B, S, h, d_head).transpose(1, 2)  # (B, h, S, d_head)
V = V.view(B, S, h, d_head).transpose(1, 2)  # (B, h, S, d_head)
scores = Q @ K.transpose(-2, -1) / math.sqrt(d_head)  # (B, h, S, S) query i vs key j
scores = scores.masked_fill(pad_mask[:, None, None, :], float("-inf"))  # padding keys: never
weights = scores.softmax(dim=-1)  # (B, h, S, S) every row sums to 1
ctx = weights @ V  # (B, h, S, d_head) each head's weighted sum of values
concat = ctx.transpose(1, 2).reshape(B, S, d)  # (B, S, h * d_head) heads side by side
out = concat @ W_O.T + b_O  # (B, S, d)

src_mask = model.padding_mask(src)  # (B, 1, 1, S) the module's sense: True = may attend
module_out, module_weights = mha(x_in, mask=src_mask, need_weights=True)
fast_out, _ = mha(x_in, mask=src_mask)  # the fused kernel training uses
torch.testing.assert_close(out, module_out, rtol=1e-5, atol=1e-5)
torch.testing.assert_close(weights, module_weights, rtol=1e-5, atol=1e-5)
torch.testing.assert_close(out, fast_out, rtol=1e-5, atol=1e-5)
print(f"hand-written == module: output {tuple(out.shape)}, weights {tuple(weights.shape)}, "
      f"max |difference| {(out - module_out).abs().max().item():.1e}")
print(f"Q, K, V per head: {tuple(Q.shape)} = (B, h, S, d_head)")

# %% [markdown]
# The model really feeds this layer `x_in`: a hook on the attention module records its
# input and output during an ordinary `model.encode`, and they match ours. And the padding
# mask matters: the short sentence, padded inside the batch, gets exactly the output it
# gets alone; without the mask its words would also attend to the padding.
#
# 模型确实把 `x_in` 送进这一层：在注意力模块上挂一个钩子（hook），记录普通的 `model.encode`
# 过程中它的输入和输出，与我们手算的一致。填充掩码也确实起作用：短句在批次里被填充后，
# 得到的输出与它单独计算时完全相同；如果不用掩码，它的词也会去关注填充位置。

# %%
seen = {}
hook = mha.register_forward_hook(
    lambda module, args, output: seen.update(query=args[0], out=output[0]))
model.encode(src)
hook.remove()
torch.testing.assert_close(seen["query"], x_in)
torch.testing.assert_close(seen["out"], out, rtol=1e-5, atol=1e-5)
print("inside model.encode, layer 0's attention sees x_in and returns our output")

n = len(short_ids) + 1  # the short sentence's real positions (</s> included)
alone = collate([short_ids], [[]]).src  # (1, n) no padding at all
x_alone = model.src_embed(alone) * model.embed_scale + model.src_pos(n)  # (1, n, d)
out_alone, _ = mha(layer.norm1(x_alone) if layer.norm_first else x_alone)
torch.testing.assert_close(out[1, :n], out_alone[0], rtol=1e-5, atol=1e-5)
no_mask, _ = mha(x_in)  # the same batch, padding not masked
print(f"short sentence: batched with mask == alone; without the mask it moves by up to "
      f"{(no_mask[1, :n] - out_alone[0]).abs().max().item():.2f}")
print(f"\nhead 0's weights for the short sentence (rows: {src_tok.pieces(short_ids)} + </s>;"
      " the last columns are padding, weight 0):")
print(weights[1, 0, :n].numpy().round(2))

# %% [markdown]
# ## 3. The decoder: masked self-attention and cross-attention
#
# The decoder writes the translation one piece at a time. Its **masked (causal)
# self-attention** uses the same module with the causal mask (`tinymt.model.causal_mask`,
# combined with padding in `model.decode`): position $t$ may look at
# positions $\le t$ only, because when the model predicts piece $t+1$ the later pieces do
# not exist yet. In the weight matrix (rows = queries, columns = keys) everything above
# the diagonal is therefore exactly 0: *the upper triangle is empty*. Changing a later
# target piece cannot change the predictions before it, which the cell checks.
#
# **Cross-attention** is where the decoder reads the source: its **queries** come from
# the decoder's own states, its **keys and values** from the encoder's output (the
# *memory*), the same memory for every decoder layer. Its map is `(T_target, S_source)`:
# for each piece being written, where in the Chinese sentence the head looks. While
# decoding, each layer projects the memory to keys/values once (`tinymt.decoding.cache`)
# and reuses them at every step.
#
# ## 3. 解码器：掩码自注意力与交叉注意力
#
# 解码器一次生成一个子词。它的**掩码（因果）自注意力**用的是同一个模块，只是加上
# 因果掩码（`tinymt.model.causal_mask`，在 `model.decode` 里与填充掩码合并）：位置 $t$ 只能看位置 $\le t$，因为模型预测第 $t+1$ 个子词时，后面的子词
# 还不存在。所以在权重矩阵（行 = 查询，列 = 键）里，对角线以上全都是 0：*上三角是空的*。
# 改动后面的目标子词不会改变它之前的预测，下面的单元格会验证这一点。
#
# **交叉注意力**是解码器读取源句的地方：**查询**来自解码器自己的状态，**键和值**来自编码器
# 的输出（*memory*），每一层解码器用的都是同一个 memory。它的注意力图是
# `(T_目标, S_源)`：对正在写的每个子词，这个头在看中文句子的哪里。解码时，每一层只把
# memory 投影成键/值一次（`tinymt.decoding.cache`），之后每一步都重复使用。

# %%
out_ids = translate_ids(model, [src_ids], beam=5)[0][0][0]  # best hypothesis of beam 5
print("translation:", tgt_tok.decode(out_ids))

one = collate([src_ids], [out_ids])  # src = pieces + </s>; tgt_in = <s> + translation
memory, _ = model.encode(one.src)  # (1, S, d)
seen = {}
hook = model.decoder_layers[0].cross_attn.register_forward_hook(
    lambda module, args, output: seen.update(query=args[0], key_value=args[1]))
hidden, attn = model.decode(one.tgt_in, memory, model.padding_mask(one.src), need_weights=True)
logits = model.logits(hidden)  # (1, T, V) scores of the next piece at every position
hook.remove()
T = one.tgt_in.size(1)

allowed = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T) query t sees keys 0..t
assert torch.equal(causal_mask(T), allowed)  # the model builds the same mask
corner = min(T, 8)
print(f"\ncausal mask, 1 = may attend (rows: queries, columns: keys; first {corner} of {T}):")
print(allowed[:corner, :corner].int())
self_w = attn["decoder_self"][0][0]  # (h, T, T) layer 0
assert self_w.triu(diagonal=1).abs().max() == 0, "a decoder position looked at the future"
print(f"decoder self-attention weights {tuple(self_w.shape)}: above the diagonal all 0")

changed = one.tgt_in.clone()
changed[0, -1] = 4 if int(changed[0, -1]) != 4 else 5  # another last piece (0-3: special ids)
logits2 = model.logits(model.decode(changed, memory, model.padding_mask(one.src))[0])
torch.testing.assert_close(logits2[:, :-1], logits[:, :-1])  # earlier predictions unchanged
print("changing the last target piece leaves every earlier prediction unchanged")

cross = model.decoder_layers[0].cross_attn
assert torch.equal(seen["key_value"], memory), "cross-attention keys/values not from memory"
q, k, v = cross.project(seen["query"], memory)  # q (1, h, T, d_head) from the decoder,
# k and v (1, h, S, d_head) each from the encoder
cross_w = attn["cross"][0]  # (1, h, T, S)
print(f"\ncross-attention: queries {tuple(q.shape)} from the decoder, keys {tuple(k.shape)} "
      f"and values {tuple(v.shape)} from the encoder memory -> weights {tuple(cross_w.shape)}")

# %% [markdown]
# ## 4. Every head, and what the analysis finds
#
# Below: every head of every layer for our sentence and the model's translation (rows =
# the piece being read or predicted, columns = the pieces looked at; blank = exactly 0).
# Then the head analysis of `tinymt.heads` on the run's validation sentences:
#
# * **importance** (Michel et al., 2019): how much the loss depends on the head's gate,
#   normalised per layer; an unimportant head can often be removed;
# * **where it looks**: *previous / self / next* (at least half its attention on that
#   position), *</s>* (*<s>* in the decoder: as much on the token a head with nothing to do
#   rests on), *diffuse* (close to uniform) or *content* (anything else);
# * **AER** (alignment error rate) of each cross-attention head against the built-in
#   corpus's gold word alignments: lower means the head aligns like a dictionary would.
#
# * **relations**: the tutorials' picture is one small brain per *relation* (subject →
#   verb, 的-clause → noun, …). The built-in corpus knows the gold relations of every
#   sentence, so for each self-attention head we count how often the word a word looks at
#   most (itself set aside) is its gold partner, and compare with the best *fixed offset*
#   ("always look one word to the left"). A head **tracks** a relation only when it beats
#   that baseline by 10 points; in a small model, few do, and positional heads explain
#   much of the rest.
#
# `python scripts/analyze_heads.py run=latest` writes the full report (with pruning
# curves and the showcase sentence drawn head by head) to `<run>/heads.md`.
#
# ## 4. 每一个头，以及分析的结论
#
# 下面是这个句子和模型译文在每一层、每一个头上的注意力图（行 = 正在读或正在预测的子词，
# 列 = 被关注的子词；空白 = 恰好为 0）。然后是 `tinymt.heads` 在这次训练的验证句上的头分析：
#
# * **重要性**（Michel 等，2019）：损失对这个头的门控有多敏感，按层归一化；不重要的头
#   往往可以去掉；
# * **看哪里**：*previous / self / next*（前一个 / 同一个 / 后一个词元：至少一半的注意力在那个
#   位置）、*</s>*（解码器里是 *<s>*：无事可做的头停靠的位置，注意力同样至少一半在那里）、
#   *diffuse*（接近均匀）或 *content*（其他情况）；
# * 每个交叉注意力头相对于内置语料金标准词对齐的 **AER**（对齐错误率）：越低，说明这个头
#   越像词典那样对齐。
#
# * **关系**：教程里的比喻是每个小脑袋关注一种*关系*（主语 → 动词、的字结构 → 名词……）。
#   内置语料知道每个句子的金标准关系，所以对每个自注意力头，我们统计一个词最关注的词（不算
#   它自己）正好是它的金标准搭档的比例，并和最好的*固定偏移*（"总是看左边第一个词"）比较。
#   只有超过这个基线 10 个百分点，才说这个头**跟踪**这种关系；在小模型里这样的头不多，
#   其余的大多可以用按位置看的头来解释。
#
# `python scripts/analyze_heads.py run=latest` 会把完整报告（包括剪枝曲线，以及逐个头画出
# 的示例句）写到 `<run>/heads.md`。

# %%
maps = collect_attention(model, src_ids, out_ids)  # {kind: [(h, T_q, T_k) per layer]}
for _, fig in attention_figures(maps, src_tok, tgt_tok, src_ids, out_ids, kinds=KINDS):
    show(fig)

# %% [markdown]
# The same maps, interactive: pick the kind and layer, hover a token to see what it looks
# at (and what looks at it) with the numbers, switch heads off, draw them as lines. The
# boxes outline the corpus's gold: cross-attention cells of aligned words, and self-attention
# cells of words joined by a gold relation (hover one for its name). This is the view of
# TensorBoard's **Attention** tab and of `translate.py attention=maps.html`: one page, no
# server.
#
# 同样的图，可以交互：选择注意力种类和层，把鼠标放在一个词元上，看它关注什么（以及谁在关注它）和
# 具体数值，关掉某些头，或改成连线图。方框标出语料的金标准：交叉注意力中对齐的词，自注意力中由
# 金标准关系相连的词（悬停可看关系名）。这和 TensorBoard 的 **Attention** 标签页、
# `translate.py attention=maps.html` 是同一个视图：一个网页，不需要服务器。

# %%
view = translation_document(maps, src_tok.pieces(src_ids), tgt_tok.pieces(out_ids), SENTENCE,
                            tgt_tok.decode(out_ids), int(run.state.get("step", 0)), gold=True)
page = html_page(run.run_dir.name, [view])  # in an <iframe srcdoc>: its module script runs
display(HTML(f'<iframe srcdoc="{html.escape(page)}" style="width:100%;height:760px;border:0">'
             "</iframe>"))  # in the frame, untouched by the notebook's HTML sanitiser

# %%
data, _, _ = load_sentences(run, "valid", 200, log=print)  # the run's own validation split
importance = normalize_importance(head_importance(model, data.src_ids, data.tgt_ids))
stats, counts, rel_counts = attention_pass(model, data.src_ids, data.tgt_ids, words=data.words)
means = stats.means()
aer = None if counts is None else alignment_summary(counts)["aer"]  # (layers, heads)
print(f"{len(data.src_ids)} validation sentences\n")
print(f"{'kind':<13} {'layer':>5} {'head':>4} {'importance':>10}  {'looks at':<15} {'AER':>5}")
for kind in KINDS:
    labels = head_labels(means[kind], kind)
    for layer_i, row in enumerate(importance[kind]):
        for head_i, score in enumerate(row):
            a = aer[layer_i, head_i] if kind == "cross" and aer is not None else None
            print(f"{kind:<13} {layer_i:>5} {head_i:>4} {score:>10.2f}  "
                  f"{labels[layer_i][head_i]:<15} {'' if a is None else f'{a:.2f}':>5}")
if aer is None:
    print("\n(no gold word alignments in this run's data: AER needs the built-in corpus)")
else:  # the best aligning head on our sentence: the source piece each output piece looks at
    best_layer, best_head = np.unravel_index(np.nanargmin(aer), aer.shape)
    w = maps["cross"][best_layer][best_head]  # (T_out + 1, S + 1)
    rows, cols = tgt_tok.pieces(out_ids) + ["</s>"], src_tok.pieces(src_ids) + ["</s>"]
    print(f"\nbest aligning head, cross layer {best_layer} head {best_head} "
          f"(AER {aer[best_layer, best_head]:.2f}), on our sentence:")
    print("  ".join(f"{r}→{cols[j]}" for r, j in zip(rows, w.argmax(axis=-1))))
if rel_counts is None:
    print("\n(no gold relations in this run's data: relations need the built-in corpus)")
else:  # the best head per relation (the dependent looks for its head) vs the baseline
    relations = relation_summary(rel_counts)
    for kind in ("encoder_self", "decoder_self"):
        print(f"\n{kind}: relation, best head, its accuracy vs the best fixed offset")
        for r in relations[kind]["rows"]:
            if r["instances"] >= 20:
                print(f"  {r['relation']:<10} {r['direction']:<9} head {r['best_head']} "
                      f"{r['best_accuracy']:.2f} vs {r['baseline']:.2f} (offset "
                      f"{r['baseline_offset']:+d}){'  <- tracks it' if r['tracks'] else ''}")

# %% [markdown]
# ## 5. Switching a head off
#
# Every head has a **gate**, a number its output is multiplied by before the heads are
# concatenated (`gated_heads(model, {kind: (layers, heads)})`); gate 0 switches the head off without
# retraining, exactly as if its slice of the concatenation were zeros (checked first). Then
# each head in turn is switched off while the sentence is translated greedily, and every
# head whose removal changes the translation is listed, most important first (then pairs
# of the most important heads, if no single head does). A well-trained model is often robust to losing one head:
# that is what "prunable" in the head analysis measures.
#
# ## 5. 关掉一个头
#
# 每个头都有一个**门控**（gate）：在拼接各个头之前，把这个头的输出乘上这个数
# （`gated_heads(model, {kind: (层数, 头数)})`）；门控为 0 就在不重新训练的情况下关掉这个头，效果
# 与把拼接结果中属于这个头的那一段置零完全相同（先验证这一点）。然后逐个关掉每个头，用贪心
# 解码翻译这个句子，按重要性从高到低列出关掉后译文会改变的头（如果单个头都不会改变译文，
# 就试最重要的头两两组合）。训练得好的模型往往少一个头也能照常翻译：头分析里的“可剪枝”衡量的正是这一点。

# %%
gate = torch.ones(h)
gate[0] = 0.0  # head 0 of encoder layer 0 off
gates = torch.ones(len(model.encoder_layers), h)
gates[0] = gate  # (layers, heads): encoder layer 0 gets this gate
with gated_heads(model, {"encoder_self": gates}):
    gated_out, _ = mha(x_in, mask=src_mask)
ctx_off = ctx.clone()
ctx_off[:, 0] = 0.0  # (B, h, S, d_head) head 0's context zeroed
torch.testing.assert_close(gated_out, ctx_off.transpose(1, 2).reshape(B, S, d) @ W_O.T + b_O,
                           rtol=1e-5, atol=1e-5)
print("gate 0 == that head's slice of the concatenation set to zero\n")


def greedy(gates=None) -> str:
    with gated_heads(model, gates):
        return tgt_tok.decode(translate_ids(model, [src_ids])[0][0][0])


base = greedy()
print(f"all heads on:  {base}")
changes = []
for head in all_heads(model):
    text = greedy(gates_without(model, [head]))
    if text != base:
        changes.append(([head], text))
if not changes:  # no single head matters: try pairs of the most important ones
    ranked = sorted(all_heads(model), key=lambda kh: -importance[kh[0]][kh[1], kh[2]])[:8]
    for i, first in enumerate(ranked):
        for second in ranked[i + 1:]:
            text = greedy(gates_without(model, [first, second]))
            if text != base:
                changes.append(([first, second], text))
changes.sort(key=lambda c: -sum(importance[k][layer_i, head_i] for k, layer_i, head_i in c[0]))
for heads, text in changes[:8]:  # the most important first
    off = " + ".join(f"{kind} layer {layer_i} head {head_i} (importance "
                     f"{importance[kind][layer_i, head_i]:.2f})" for kind, layer_i, head_i in heads)
    print(f"without {off}:\n               {text}")
if changes:
    print(f"\n{len(changes)} head(s) or pair(s) change this translation")
else:
    print("\nno single head, and no pair of the 8 most important heads, changes this "
          "translation: this model does not depend on any one head for this sentence")

# %% [markdown]
# ## Where next
#
# * `python scripts/translate.py run=latest attention=maps.png attention_kinds=[cross,decoder_self] "那只小猫昨天在公园里追了一只蝴蝶。"`
#   draws these maps for any sentence;
# * `python scripts/analyze_heads.py run=latest prune=0.3` masks the least important 30% of
#   heads and writes a checkpoint that translates without them;
# * `tensorboard --logdir outputs` shows every head's map at every validation of training;
# * `src/tinymt/attention.py` is the module you just re-derived, in four numbered steps.
#
# ## 接下来
#
# * `python scripts/translate.py run=latest attention=maps.png ...` 为任何句子画出这些注意力图；
# * `python scripts/analyze_heads.py run=latest prune=0.3` 屏蔽最不重要的 30% 的头，并写出
#   一个不用这些头也能翻译的检查点；
# * `tensorboard --logdir outputs` 显示训练中每次验证时每个头的注意力图；
# * `src/tinymt/attention.py` 就是你刚才亲手推导的模块，分成四个编号的步骤。
