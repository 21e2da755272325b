# Reproduction of https://github.com/jasonppy/word-discovery/pull/4 (training VG-HuBERT's AudioEncoder fails with "one
# of the variables needed for gradient computation has been modified by an inplace operation: [BS, 768, 399], which
# is output 0 of AsStridedBackward0": the convolutional positional embedding is added with x += x_conv, where
# x.transpose(1, 2) was the input of pos_conv and so was saved by the convolution for its backward; the pull request
# writes x = x + x_conv. models/audio_encoder.py's AudioEncoder.forward and ConvFeatureExtractionModel as in the
# repository; fairseq's LayerNorm/SamePad/GradMultiply and the transformer layers are replaced by torch equivalents,
# sizes shrunk (embed 48, 2 layers, 0.1 s of random 16 kHz audio), a made-up contrastive loss on the cls token).
import argparse
import math
from typing import List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)

LayerNorm = nn.LayerNorm


class SamePad(nn.Module):  # fairseq.modules.SamePad
    def __init__(self, kernel_size):
        super().__init__()
        self.remove = 1 if kernel_size % 2 == 0 else 0

    def forward(self, x):
        if self.remove > 0:
            x = x[:, :, : -self.remove]
        return x


class Fp32GroupNorm(nn.GroupNorm):  # fairseq.modules.Fp32GroupNorm
    def forward(self, input):
        output = F.group_norm(input.float(), self.num_groups,
                              self.weight.float() if self.weight is not None else None,
                              self.bias.float() if self.bias is not None else None, self.eps)
        return output.type_as(input)


class AudioEncoder(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.args = args
        feature_enc_layers = eval(args.conv_feature_layers)
        self.embed = feature_enc_layers[-1][0]

        self.feature_extractor = ConvFeatureExtractionModel(
            conv_layers=feature_enc_layers,
            dropout=0.0,
            mode=args.extractor_mode,
            conv_bias=args.conv_bias,
        )

        self.post_extract_proj = (
            nn.Linear(self.embed, args.encoder_embed_dim)
            if self.embed != args.encoder_embed_dim
            else None
        )

        self.dropout_input = nn.Dropout(args.dropout_input)
        self.dropout_features = nn.Dropout(args.dropout_features)

        self.feature_grad_mult = args.feature_grad_mult

        self.pos_conv = nn.Conv1d(
                self.args.encoder_embed_dim,
                self.args.encoder_embed_dim,
                kernel_size=args.conv_pos,
                padding=args.conv_pos // 2,
                groups=args.conv_pos_groups,
            )
        dropout = 0
        std = math.sqrt((4 * (1.0 - dropout)) / (args.conv_pos * self.args.encoder_embed_dim))
        nn.init.normal_(self.pos_conv.weight, mean=0, std=std)
        nn.init.constant_(self.pos_conv.bias, 0)

        self.pos_conv = nn.utils.weight_norm(self.pos_conv, name="weight", dim=2)
        self.pos_conv = nn.Sequential(self.pos_conv, SamePad(args.conv_pos), nn.GELU())
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(args.encoder_embed_dim, args.encoder_attention_heads,
                                       args.encoder_ffn_embed_dim, dropout=0.0, batch_first=True),
            num_layers=args.encoder_layers)
        self.layer_norm = LayerNorm(self.embed)

        if self.args.use_audio_cls_token:
            self.cls_token = torch.nn.Parameter(torch.randn((1, 1, args.encoder_embed_dim)), requires_grad=True)

    def forward(self, source, padding_mask=None):

        if self.feature_grad_mult > 0:
            features = self.feature_extractor(source)
        else:
            with torch.no_grad():
                features = self.feature_extractor(source)

        features_pen = features.float().pow(2).mean()

        features = features.transpose(1, 2)
        features = self.layer_norm(features)
        unmasked_features = features.clone()

        if self.post_extract_proj is not None:
            features = self.post_extract_proj(features)

        features = self.dropout_input(features)
        unmasked_features = self.dropout_features(unmasked_features)

        x = features
        x_conv = self.pos_conv(x.transpose(1, 2))
        x_conv = x_conv.transpose(1, 2)
        x += x_conv
        if self.args.use_audio_cls_token:
            x = torch.cat([self.cls_token.repeat(x.shape[0],1,1), x], dim=1)

        layer_feats = self.encoder(x)
        features = layer_feats
        if self.args.use_audio_cls_token:
            cls_token = layer_feats[:,0]
            features = features[:,1:]
            layer_feats = layer_feats[:,1:]
        else:
            cls_token = None

        result = {"features": features, "layer_feats": layer_feats, "cls_token": cls_token, "padding_mask": padding_mask, "features_pen": features_pen}

        return result


class ConvFeatureExtractionModel(nn.Module):
    def __init__(
        self,
        conv_layers: List[Tuple[int, int, int]],
        dropout: float = 0.0,
        mode: str = "default",
        conv_bias: bool = False,
        first_conv = True
    ):
        super().__init__()

        assert mode in {"default", "layer_norm"}

        def block(
            n_in,
            n_out,
            k,
            stride,
            is_layer_norm=False,
            is_group_norm=False,
            conv_bias=False,
        ):
            def make_conv():
                conv = nn.Conv1d(n_in, n_out, k, stride=stride, bias=conv_bias)
                nn.init.kaiming_normal_(conv.weight)
                return conv

            if is_group_norm:
                return nn.Sequential(
                    make_conv(),
                    nn.Dropout(p=dropout),
                    Fp32GroupNorm(dim, dim, affine=True),
                    nn.GELU(),
                )
            else:
                return nn.Sequential(make_conv(), nn.Dropout(p=dropout), nn.GELU())

        in_d = 1
        self.conv_layers = nn.ModuleList()
        for i, cl in enumerate(conv_layers):
            assert len(cl) == 3, "invalid conv definition: " + str(cl)
            (dim, k, stride) = cl

            self.conv_layers.append(
                block(
                    in_d,
                    dim,
                    k,
                    stride,
                    is_layer_norm=mode == "layer_norm",
                    is_group_norm=mode == "default" and i == 0,
                    conv_bias=conv_bias,
                )
            )
            in_d = dim

    def forward(self, x):

        # BxT -> BxCxT
        if len(x.shape) == 2:
            x = x.unsqueeze(1)

        for conv in self.conv_layers:
            x = conv(x)

        return x


args = argparse.Namespace(
    conv_feature_layers="[(32, 10, 5)] + [(32, 3, 2)] * 2", extractor_mode="default", conv_bias=False,
    encoder_embed_dim=48, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_embed_dim=64,
    dropout_input=0.1, dropout_features=0.1, feature_grad_mult=1.0, conv_pos=16, conv_pos_groups=4,
    use_audio_cls_token=True)
audio_encoder = AudioEncoder(args)
visual_cls = nn.Linear(48, 48)
optimizer = torch.optim.AdamW(list(audio_encoder.parameters()) + list(visual_cls.parameters()), lr=1e-4)
audio_encoder.train()
for step in range(2):
    audio = torch.randn(4, 1600)
    images = torch.randn(4, 48)
    out = audio_encoder(audio)
    audio_cls = F.normalize(out["cls_token"], dim=-1)
    image_cls = F.normalize(visual_cls(images), dim=-1)
    logits = audio_cls @ image_cls.t() / 0.07
    target = torch.arange(4)
    loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2 + 10 * out["features_pen"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, loss.item())
