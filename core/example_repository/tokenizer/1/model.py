"""tokenizer: WordPiece tokenization of UTF-8 text with the vocabulary in the model folder's vocab.txt."""
import os
import re
import unicodedata

import numpy as np
import triton_python_backend_utils as pb_utils

_PIECES = re.compile(r"\w+|[^\w\s]")
_MAX_WORD_CHARS = 100


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config
        config.set_max_batch_size(8)
        config.add_input({"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]})
        config.add_output({"name": "TOKEN_IDS", "data_type": "TYPE_INT64", "dims": [-1]})
        config.add_output({"name": "LENGTH", "data_type": "TYPE_INT64", "dims": [1]})
        return config

    def initialize(self, args):
        path = os.path.join(args["model_repository"], "vocab.txt")
        with open(path, encoding="utf-8") as vocab_file:
            tokens = [line.rstrip("\n") for line in vocab_file if line.strip()]
        self.vocab = {token: index for index, token in enumerate(tokens)}
        self.pad, self.unk = self.vocab["[PAD]"], self.vocab["[UNK]"]
        self.cls, self.sep = self.vocab["[CLS]"], self.vocab["[SEP]"]
        pb_utils.Logger.log_info(f"tokenizer loaded {len(tokens)} tokens from {path}")

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            try:
                rows = [self.encode(text.decode("utf-8")) for text in texts]
            except UnicodeDecodeError as error:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"TEXT must be UTF-8: {error}", pb_utils.TritonError.INVALID_ARG)))
                continue
            token_ids = np.full((len(rows), max(len(row) for row in rows)), self.pad, dtype=np.int64)
            for index, row in enumerate(rows):
                token_ids[index, :len(row)] = row
            lengths = np.array([[len(row)] for row in rows], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("TOKEN_IDS", token_ids), pb_utils.Tensor("LENGTH", lengths)]))
        return responses

    def encode(self, text):
        """[CLS] + the WordPiece ids of each word and punctuation mark + [SEP]."""
        ids = [self.cls]
        for word in _PIECES.findall(self.normalize(text)):
            ids.extend(self.word_pieces(word))
        ids.append(self.sep)
        return ids

    @staticmethod
    def normalize(text):
        """Lower-case, with accents stripped (NFD, then drop combining marks)."""
        decomposed = unicodedata.normalize("NFD", text.lower())
        return "".join(char for char in decomposed if unicodedata.category(char) != "Mn")

    def word_pieces(self, word):
        """Greedy longest-match-first split into vocabulary pieces; [UNK] if the word cannot be split."""
        if len(word) > _MAX_WORD_CHARS:
            return [self.unk]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    pieces.append(self.vocab[piece])
                    break
                end -= 1
            else:
                return [self.unk]
            start = end
        return pieces
