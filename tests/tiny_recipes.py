"""Recipe text the end-to-end tests share (importable from every test folder: tests/conftest.py).

``TINY_VIT_MODEL`` is the ``model`` section of a tiny ViT trained from a config on Fashion-MNIST (2 layers of
4 heads, hidden 32, MLP 64, 28x28 one-channel images), written for ``str.format`` (its braces doubled), so a
test's recipe template is its own text around it.
"""

TINY_VIT_MODEL = """\
model:
  family: vit
  from_config: {{image_size: 28, patch_size: 7, num_channels: 1, hidden_size: 32, num_hidden_layers: 2,
                num_attention_heads: 4, intermediate_size: 64}}
  image_size: 28
  num_channels: 1
"""
