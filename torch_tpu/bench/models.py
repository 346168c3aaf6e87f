"""Models used by the benchmark workloads (worker side; imports torch)."""

import torch
from torch import nn


class MLP(nn.Sequential):
    """Three linear layers with GELU: d -> h -> h -> d."""

    def __init__(self, d, h):
        super().__init__(nn.Linear(d, h), nn.GELU(), nn.Linear(h, h), nn.GELU(), nn.Linear(h, d))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        idt = x if self.down is None else self.down(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + idt)


class SmallResNet(nn.Module):
    """ResNet-18 layout (stem, 4 stages x 2 basic blocks, pool, fc) at reduced width.

    width=32 gives channels 32/64/128/256 (half of ResNet-18's), 3.1M parameters and
    0.97 GFLOP per 224x224 image (2 * MACs of the conv and linear layers).
    """

    def __init__(self, width=32, blocks=(2, 2, 2, 2), classes=1000):
        super().__init__()
        w = width
        self.stem = nn.Sequential(
            nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1))
        layers, cin = [], w
        for i, nb in enumerate(blocks):
            cout = w * 2**i
            for j in range(nb):
                layers.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


def count_flops(model, example):
    """2 * MACs of every Conv2d and Linear for one forward of `example` (on cpu)."""
    total = [0]

    def conv_hook(m, inp, out):
        kh, kw = m.kernel_size
        total[0] += 2 * out.numel() * (m.in_channels // m.groups) * kh * kw

    def lin_hook(m, inp, out):
        total[0] += 2 * out.numel() * m.in_features

    hooks = []
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            hooks.append(m.register_forward_hook(conv_hook))
        elif isinstance(m, nn.Linear):
            hooks.append(m.register_forward_hook(lin_hook))
    with torch.no_grad():
        model(example)
    for h in hooks:
        h.remove()
    return total[0]


def gpt2_config(quick):
    """GPT-2-small width (random weights, nothing downloaded); tiny in --quick."""
    from transformers import GPT2Config

    if quick:
        kw = dict(n_embd=64, n_head=2, n_layer=1, vocab_size=512, n_positions=64)
    else:
        kw = dict(n_embd=768, n_head=12, n_layer=12, vocab_size=50257, n_positions=1024)
    return GPT2Config(**kw)


def gpt2_model(quick):
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = gpt2_config(quick)
    try:
        return GPT2LMHeadModel(cfg, attn_implementation="sdpa")
    except TypeError:
        cfg._attn_implementation = "sdpa"
        return GPT2LMHeadModel(cfg)


def gpt2_flops_per_token_fwd(cfg, ctx_len):
    """Forward FLOPs per token: 2 * matmul params + attention scores/values.

    matmul params per layer: qkv 3d^2 + proj d^2 + mlp 8d^2 = 12 d^2, plus the lm
    head d*V. Attention: QK^T and AV cost 2 * 2 * ctx_len * d per token per layer
    (counted over the full square, as the kernels compute it).
    """
    d, L, V = cfg.n_embd, cfg.n_layer, cfg.vocab_size
    return 2 * (12 * d * d * L + d * V) + 4 * ctx_len * d * L
