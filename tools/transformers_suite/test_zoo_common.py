"""Transformers' own ModelTesterMixin (the release sdist's, 5.24 and 5.25) over tiny configs of a few zoo models.
tools/transformers_suite/setup.sh lays it out; tools/transformers_tests.py runs it on cpu and tpu and compares."""

import unittest

import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BartModel,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    CLIPTextConfig,
    CLIPTextModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Gemma3TextModel,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForSequenceClassification,
    LlamaModel,
    MistralConfig,
    MistralForCausalLM,
    MistralModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3Model,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3MoeModel,
    T5Config,
    T5ForConditionalGeneration,
    T5Model,
    ViTConfig,
    ViTForImageClassification,
    ViTModel,
    WhisperConfig,
    WhisperForConditionalGeneration,
    WhisperModel,
)
from transformers.testing_utils import torch_device

from ...test_configuration_common import ConfigTester
from ...test_modeling_common import ModelTesterMixin, floats_tensor, ids_tensor


class Tester:
    batch_size, seq_length, vocab_size, hidden_size = 13, 7, 99, 32
    num_hidden_layers, num_attention_heads, is_training = 2, 4, True
    num_labels, num_choices, type_sequence_label_size = 3, 4, 2

    def __init__(self, parent, make_config):
        self.parent = parent
        self.make_config = make_config

    def get_config(self):
        return self.make_config(self)

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        mask = torch.tril(torch.ones_like(input_ids)).to(torch_device)
        return self.get_config(), {"input_ids": input_ids, "attention_mask": mask}


def _decoder(cls):
    return lambda t: cls(
        vocab_size=t.vocab_size,
        hidden_size=t.hidden_size,
        num_hidden_layers=t.num_hidden_layers,
        num_attention_heads=t.num_attention_heads,
        num_key_value_heads=2,
        intermediate_size=37,
        max_position_embeddings=512,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        head_dim=8,
    )


class _Base(ModelTesterMixin):
    config_fn = None

    def setUp(self):
        self.model_tester = Tester(self, type(self).config_fn)
        self.config_tester = ConfigTester(self, config_class=type(self.model_tester.get_config()))

    def test_config(self):
        self.config_tester.run_common_tests()


class LlamaTest(_Base, unittest.TestCase):
    all_model_classes = (LlamaModel, LlamaForCausalLM, LlamaForSequenceClassification)
    config_fn = staticmethod(_decoder(LlamaConfig))


class MistralTest(_Base, unittest.TestCase):
    all_model_classes = (MistralModel, MistralForCausalLM)
    config_fn = staticmethod(_decoder(MistralConfig))


class Qwen3Test(_Base, unittest.TestCase):
    all_model_classes = (Qwen3Model, Qwen3ForCausalLM)
    config_fn = staticmethod(_decoder(Qwen3Config))


class GPT2Test(_Base, unittest.TestCase):
    all_model_classes = (GPT2Model, GPT2LMHeadModel)
    config_fn = staticmethod(
        lambda t: GPT2Config(
            vocab_size=t.vocab_size,
            n_embd=t.hidden_size,
            n_layer=2,
            n_head=4,
            n_positions=512,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )


class BertTest(_Base, unittest.TestCase):
    all_model_classes = (BertModel, BertForMaskedLM, BertForSequenceClassification)
    # BERT's embeddings are most of this tiny model: at 70% the device gets nothing and there is no
    # device map to check (the same arithmetic for any accelerator)
    model_split_percents = [0.5, 0.8, 0.9]
    config_fn = staticmethod(
        lambda t: BertConfig(
            vocab_size=t.vocab_size,
            hidden_size=t.hidden_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=512,
            type_vocab_size=16,
            pad_token_id=0,
        )
    )


class Qwen3MoeTest(_Base, unittest.TestCase):
    all_model_classes = (Qwen3MoeModel, Qwen3MoeForCausalLM)
    test_all_params_have_gradient = False
    config_fn = staticmethod(
        lambda t: Qwen3MoeConfig(
            vocab_size=t.vocab_size,
            hidden_size=t.hidden_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=37,
            moe_intermediate_size=12,
            num_experts=8,
            num_experts_per_tok=2,
            head_dim=8,
            max_position_embeddings=512,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )


class Gemma3TextTest(_Base, unittest.TestCase):
    all_model_classes = (Gemma3TextModel, Gemma3ForCausalLM)
    config_fn = staticmethod(
        lambda t: Gemma3TextConfig(
            vocab_size=t.vocab_size,
            hidden_size=t.hidden_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=37,
            head_dim=8,
            max_position_embeddings=512,
            sliding_window=4,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
    )


class T5Tester(Tester):
    encoder_seq_length = decoder_seq_length = Tester.seq_length

    def prepare_config_and_inputs_for_common(self):
        config, inputs = super().prepare_config_and_inputs_for_common()
        inputs["decoder_input_ids"] = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        inputs["decoder_attention_mask"] = torch.ones_like(inputs["decoder_input_ids"])
        return config, inputs


class T5Test(_Base, unittest.TestCase):
    all_model_classes = (T5Model, T5ForConditionalGeneration)
    is_encoder_decoder = True
    config_fn = staticmethod(
        lambda t: T5Config(
            vocab_size=t.vocab_size,
            d_model=t.hidden_size,
            d_kv=8,
            d_ff=37,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=0,
            eos_token_id=1,
            decoder_start_token_id=0,
        )
    )

    def setUp(self):
        self.model_tester = T5Tester(self, type(self).config_fn)
        self.config_tester = ConfigTester(self, config_class=T5Config)


class ViTTester(Tester):
    image_size, patch_size, num_channels = 16, 4, 3
    seq_length = (16 // 4) ** 2 + 1

    def prepare_config_and_inputs_for_common(self):
        pixels = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
        return self.get_config(), {"pixel_values": pixels}


class ViTTest(_Base, unittest.TestCase):
    all_model_classes = (ViTModel, ViTForImageClassification)
    test_resize_embeddings = False
    config_fn = staticmethod(
        lambda t: ViTConfig(
            image_size=t.image_size,
            patch_size=t.patch_size,
            num_channels=3,
            hidden_size=t.hidden_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            num_labels=3,
        )
    )

    def setUp(self):
        self.model_tester = ViTTester(self, type(self).config_fn)
        self.config_tester = ConfigTester(self, config_class=ViTConfig, has_text_modality=False)


class BartTest(_Base, unittest.TestCase):
    all_model_classes = (BartModel, BartForConditionalGeneration)
    is_encoder_decoder = True
    config_fn = staticmethod(
        lambda t: BartConfig(
            vocab_size=t.vocab_size,
            d_model=t.hidden_size,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            max_position_embeddings=64,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=2,
        )
    )

    def setUp(self):
        self.model_tester = T5Tester(self, type(self).config_fn)
        self.config_tester = ConfigTester(self, config_class=BartConfig)


class CLIPTextTest(_Base, unittest.TestCase):
    all_model_classes = (CLIPTextModel,)
    config_fn = staticmethod(
        lambda t: CLIPTextConfig(
            vocab_size=t.vocab_size,
            hidden_size=t.hidden_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=32,
            projection_dim=16,
        )
    )


class CLIPVisionTest(_Base, unittest.TestCase):
    all_model_classes = (CLIPVisionModel,)
    test_resize_embeddings = False
    config_fn = staticmethod(
        lambda t: CLIPVisionConfig(
            image_size=t.image_size,
            patch_size=t.patch_size,
            hidden_size=t.hidden_size,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            projection_dim=16,
        )
    )

    def setUp(self):
        self.model_tester = ViTTester(self, type(self).config_fn)
        self.config_tester = ConfigTester(self, config_class=CLIPVisionConfig, has_text_modality=False)


class WhisperTester(Tester):
    num_mel_bins, max_source_positions = 8, 30
    seq_length = 7
    encoder_seq_length = max_source_positions
    decoder_seq_length = 7

    def prepare_config_and_inputs_for_common(self):
        feats = floats_tensor([self.batch_size, self.num_mel_bins, 2 * self.max_source_positions])
        dec = ids_tensor([self.batch_size, self.decoder_seq_length], self.vocab_size)
        return self.get_config(), {"input_features": feats, "decoder_input_ids": dec}


class WhisperTest(_Base, unittest.TestCase):
    all_model_classes = (WhisperModel, WhisperForConditionalGeneration)
    is_encoder_decoder = True
    config_fn = staticmethod(
        lambda t: WhisperConfig(
            vocab_size=t.vocab_size,
            d_model=t.hidden_size,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=37,
            decoder_ffn_dim=37,
            num_mel_bins=t.num_mel_bins,
            max_source_positions=t.max_source_positions,
            max_target_positions=40,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            suppress_tokens=None,
            begin_suppress_tokens=None,
        )
    )

    def setUp(self):
        self.model_tester = WhisperTester(self, type(self).config_fn)
        self.config_tester = ConfigTester(self, config_class=WhisperConfig)
