"""Differential test: slime-ref's built-in rewards on a corpus of tricky answers, against slime v0.3.1.

Not a port. Every expected value below was worked out by running slime v0.3.1's own reward
functions (``slime/rollout/rm_hub``, THUDM/slime @ a6272da, through ``async_rm``'s dispatch) on
the same input; slime's code is not part of this repository. The corpus covers ``\\boxed`` variants
(last box, unclosed, ``\\fbox``, ``\\boxed 42``, nested), fractions (reduced or not, ``\\frac12``,
``a/b``, decimals), LaTeX (``\\left``, ``\\text``, ``\\dfrac``, ``\\sqrt``, degrees, ``\\%``, ``\\$``), units,
negatives, "The answer is ...", tuples and intervals, thousands commas, text answers, labels of
every type, empty and None.

Three lists:

- ``SLIME_VALUES``: slime returns a value; slime-ref must return the same one.
- ``SLIME_RAISES``: slime raises (the exception is named); slime-ref returns the failure score
  (math/deepscaler/f1/gpqa 0, dapo -1) and never raises.
- ``DELIBERATE``: the one kind of input where slime-ref keeps a different value on purpose, the
  ``boxed_`` prefix (slime's value, then ours; see reference_impl/ARCHITECTURE.md, "Where slime-ref
  differs from slime").
"""

from __future__ import annotations

import copy

import pytest

from slime_ref.rollout.rewards import rule_based_reward

ANSWER_THEN_FILLER = "Answer: 42" + " filler" * 60  # the answer line falls outside dapo's 300-char tail
LONG_THEN_ANSWER = "x" * 400 + "\nAnswer: 42"  # ... and here it is inside

# (rm_type, response, label, metadata, slime's value)
SLIME_VALUES = [
    ('math', 'The sum is 3 + 5, so the answer is \\boxed{8}.', '8', None, 1),
    ('math', '\\boxed{8}', '8', None, 1),
    ('math', '8', '8', None, 0),
    ('math', 'The answer is 8.', '8', None, 0),
    ('math', 'Answer: 8', '8', None, 0),
    ('math', '\\boxed{9}', '8', None, 0),
    ('math', 'It looks like 8, but checking again gives \\boxed{9}', '8', None, 0),
    ('math', 'First \\boxed{7}; correcting: \\boxed{8}', '8', None, 1),
    ('math', 'First \\boxed{8}; then \\boxed 7', '8', None, 0),
    ('math', '\\boxed{8} and \\boxed{', '8', None, 0),
    ('math', '\\boxed{\\frac{1}{2}}', '0.5', None, 1),
    ('math', '\\boxed{1/2}', '\\frac{1}{2}', None, 1),
    ('math', '\\boxed{0.5}', '1/2', None, 1),
    ('math', '\\boxed{\\dfrac{1}{2}}', '1/2', None, 1),
    ('math', '\\boxed{\\frac12}', '0.5', None, 1),
    ('math', '0.5', '\\frac{1}{2}', None, 0),
    ('math', '\\boxed{1/2}.', '0.5', None, 1),
    ('math', '\\boxed{.5}', '1/2', None, 1),
    ('math', '\\boxed{\\frac{2}{4}}', '\\frac{1}{2}', None, 0),
    ('math', '\\boxed{2/4}', '1/2', None, 0),
    ('math', '\\boxed{0.33}', '\\frac{1}{3}', None, 0),
    ('math', '\\boxed{-\\frac{3}{4}}', '-0.75', None, 1),
    ('math', '\\boxed{\\left( 1, 2 \\right)}', '(1,2)', None, 1),
    ('math', '\\boxed{(2, 1)}', '(1, 2)', None, 0),
    ('math', '\\boxed{[1, 2]}', '(1, 2)', None, 0),
    ('math', '\\boxed{x = 5}', '5', None, 1),
    ('math', '\\boxed{5\\text{ cm}}', '5', None, 1),
    ('math', '\\boxed{5 cm}', '5', None, 1),
    ('math', '\\boxed{5 \\text{ cm} and 6\\text{ cm}}', '5', None, 0),
    ('math', '\\boxed{90^\\circ}', '90', None, 1),
    ('math', '\\boxed{90^{\\circ}}', '90', None, 1),
    ('math', '\\boxed{50\\%}', '50', None, 1),
    ('math', '\\boxed{50%}', '50', None, 1),
    ('math', '\\boxed{\\$1,000}', '1000', None, 1),
    ('math', '\\boxed{1,000,000}', '1000000', None, 1),
    ('math', '\\boxed{2\\sqrt{2}}', '\\sqrt{8}', None, 1),
    ('math', '\\boxed{\\sqrt2}', '\\sqrt{2}', None, 1),
    ('math', '\\boxed{\\frac{\\pi}{2}}', '\\pi/2', None, 1),
    ('math', '\\boxed{3\\pi}', '\\pi', None, 0),
    ('math', '\\boxed{(x+1)^2}', 'x^2+2x+1', None, 1),
    ('math', '\\boxed{x^2+1}', 'x^2+2x+1', None, 0),
    ('math', 'So $\\boxed{12}$.', '12', None, 1),
    ('math', '\\boxed{12}', '21', None, 0),
    ('math', 'I do not know.', '8', None, 0),
    ('math', '', '8', None, 0),
    ('math', '\\boxed{8}', 'The total is \\boxed{8}', None, 1),
    ('math', '\\boxed{\\text{Yes}}', 'yes', None, 1),
    ('math', '\\boxed{\\text{(A)}}', 'A', None, 1),
    ('math', '\\boxed{}', '8', None, 0),
    ('math', '\\boxed{8', '8', None, 0),
    ('math', 'The final answer is $\\boxed{\\frac{3}{2}}$.', '1.5', None, 1),
    ('math', '\\boxed{8.0}', '8', None, 1),
    ('math', '\\boxed{-8}', '8', None, 0),
    ('math', '\\boxed{-8}', '-8', None, 1),
    ('math', '\\boxed{- 8}', '-8', None, 1),
    ('math', '\\boxed{10^{3}}', '1000', None, 0),
    ('math', '\\boxed{8}<|im_end|>', '8', None, 1),
    ('math', "\\boxed{__import__('os').getcwd()}", '0', None, 0),
    ('math', '\\boxed{4 2}', '42', None, 1),
    ('math', '\\boxed{7 3/4}', '7.75', None, 1),
    ('math', '\\fbox{42}', '42', None, 0),
    ('math', '\\boxed 42', '42', None, 0),
    ('math', '\\boxed{42}', 42, None, 1),
    ('math', '\\boxed{42}', 42.0, None, 1),
    ('math', '\\boxed{0}', 0, None, 0),
    ('math', '\\boxed{0}', '0', None, 1),
    ('math', '\\boxed{42}', None, None, 0),
    ('math', '\\boxed{42}', '', None, 0),
    ('math', '\\boxed{\\boxed{42}}', '42', None, 1),
    ('math', '\\boxed{{42}}', '42', None, 1),
    ('math', '\\boxed{\\{1,2\\}}', '\\{1,2\\}', None, 1),
    ('math', '\\boxed{a \\text{ and } b}', 'a,b', None, 1),
    ('math', '\\boxed{3 million}', '3000000', None, 0),
    ('math', '\\boxed{\\frac{1}{\\sqrt{2}}}', '\\frac{\\sqrt{2}}{2}', None, 1),
    ('math', '\\boxed{k=3}', '3', None, 1),
    ('math', '\\boxed{y = 2x+1}', '2x+1', None, 1),
    ('math', '\\boxed{\\text{Paris}}', 'Paris', None, 1),
    ('math', '\\boxed{infinity}', '\\infty', None, 0),
    ('math', '\\boxed{\\infty}', '\\infty', None, 1),
    ('math', '\\boxed{2^{10}}', '1024', None, 0),
    ('math', '\\boxed{1e3}', '1000', None, 1),
    ('math', '\\boxed{\\frac{1}{0}}', '1', None, 0),
    ('math', '\\boxed{1/0}', '1/0', None, 1),
    ('math', '\\boxed{\\sqrt}', '2', None, 0),
    ('math', '\\boxed{\\frac}', '2', None, 0),
    ('math', '\\boxed{\\frac1}', '1', None, 0),
    ('math', '\\boxed{3.50}', '3.5', None, 1),
    ('math', '\\boxed{\\frac{7}{2}}', '3.5', None, 1),
    ('math', '\\boxed{\\text{ cm}}', '0', None, 0),
    ('math', '\\boxed{x}', 'X', None, 1),
    ('math', '\\boxed{\\$5.00}', '5', None, 1),
    ('math', '\\boxed{5\\,000}', '5000', None, 0),
    ('math', '\\boxed{5{,}000}', '5000', None, 1),
    ('math', '\\boxed{\\mathbf{42}}', '42', None, 1),
    ('math', '\\boxed{\\textbf{42}}', '42', None, 1),
    ('math', 'The answer is \\boxed{-3}', '-3', None, 1),
    ('math', '\\boxed{-3}', '3', None, 0),
    ('math', '\\boxed{ -3 }', '-3', None, 1),
    ('math', '\\boxed{\\frac{-1}{2}}', '-\\frac{1}{2}', None, 1),
    ('math', '\\boxed{-0.5}', '-1/2', None, 1),
    ('math', 'The answer is 42', '42', None, 0),
    ('math', 'The answer is $42$', '42', None, 0),
    ('math', '\\boxed{\\text{42 apples}}', '42', None, 0),
    ('math', '\\boxed{42 \\text{ apples}}', '42', None, 1),
    ('math', '\\boxed{12 \\mbox{ cm}}', '12', None, 1),
    ('math', '\\boxed{3 inches}', '3', None, 1),
    ('math', '\\boxed{5 hours}', '5', None, 1),
    ('math', '\\boxed{\\dfrac{3}{4}}', '0.75', None, 1),
    ('math', '\\boxed{\\sqrt{3}/2}', '\\frac{\\sqrt{3}}{2}', None, 1),
    ('math', '\\boxed{\\frac{\\sqrt{3}}{2}}', '\\frac{\\sqrt3}{2}', None, 1),
    ('math', '\\boxed{{\\frac{1}{2}}}', '1/2', None, 1),
    ('math', '\\boxed{\\left\\{1, 2\\right\\}}', '\\{1,2\\}', None, 1),
    ('math', '\\boxed{x^{2}}', 'x^2', None, 1),
    ('math', '\\boxed{2x}', '2*x', None, 1),
    ('math', '\\boxed{(-\\infty, 2)}', '(-\\infty,2)', None, 1),
    ('math', '\\boxed{[0, 1)}', '[0,1)', None, 1),
    ('math', '\\boxed{1, 2}', '2, 1', None, 0),
    ('math', '\\boxed{A}', 'A', None, 1),
    ('math', '\\boxed{(A)}', 'A', None, 1),
    ('math', '\\boxed{\\textbf{(C)}}', 'C', None, 1),
    ('math', '\\boxed{0.1}', '\\frac{1}{10}', None, 1),
    ('math', '\\boxed{10\\%}', '0.1', None, 0),
    ('math', '\\boxed{1000}', '1,000', None, 1),
    ('math', '\\boxed{1,000}', '1000', None, 1),
    ('deepscaler', 'Let me reconsider. \\boxed{99}</think>Final: \\boxed{42}', '42', None, 1),
    ('deepscaler', 'Scratch work \\boxed{wrong}###Response\\boxed{42}', '42', None, 1),
    ('deepscaler', '\\boxed{42}', '42', None, 0),
    ('deepscaler', 'plain</think>no box here', '42', None, 0),
    ('deepscaler', '</think>\\boxed{42}', '', None, 0),
    ('deepscaler', '</think>\\boxed{42}', 42, None, 1),
    ('deepscaler', '</think>\\boxed{42}', 42.0, None, 1),
    ('deepscaler', '</think>\\boxed{42}', '\\boxed{42}', None, 1),
    ('deepscaler', '</think>\\boxed{43}', '42', None, 0),
    ('deepscaler', '</think>\\boxed{\\frac{1}{2}}', '0.5', None, 1),
    ('deepscaler', '<think>maybe \\boxed{3}</think> so \\boxed{1/2}', '0.5', None, 1),
    ('deepscaler', '<think>\\boxed{1/2}</think> so \\boxed{3}', '0.5', None, 0),
    ('deepscaler', '</think> the answer is 1/2', '0.5', None, 0),
    ('deepscaler', '###Response \\boxed{7}', '7', None, 1),
    ('deepscaler', '</think>\\boxed{0}', 0, None, 1),
    ('deepscaler', '</think>\\boxed{2/4}', '1/2', None, 0),
    ('deepscaler', '</think>\\boxed{42}', '\\boxed 42', None, 0),
    ('deepscaler', 'a###Response b###Response \\boxed{1}', '1', None, 0),
    ('deepscaler', '</think>\\fbox{42}', '42', None, 0),
    ('dapo', 'Answer: an 42', 42, None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: The answer is $42$ apples', 42, None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: 42.', 42, None, {'score': -1.0, 'acc': False, 'pred': '42.'}),
    ('dapo', 'Answer: 42\\%', 42, None, {'score': -1.0, 'acc': False, 'pred': '42\\%'}),
    ('dapo', 'Answer: 42', '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Long solution. Answer: 42', '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: 41 was a wrong guess.\nAnswer: 42', '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'just a number 42', '42', None, {'score': -1.0, 'acc': False, 'pred': '[INVALID]'}),
    ('dapo', 'work...\nAnswer: 12\nmore\nAnswer: $34$', '34', None, {'score': 1.0, 'acc': True, 'pred': '34'}),
    ('dapo', 'Answer: 1,000 dollars', '1000.0', None, {'score': 1.0, 'acc': True, 'pred': '1000'}),
    ('dapo', 'Answer: x = 7', '7', None, {'score': 1.0, 'acc': True, 'pred': '7'}),
    ('dapo', 'Answer: 35', '34', None, {'score': -1.0, 'acc': False, 'pred': '35'}),
    ('dapo', 'no final line', '34', None, {'score': -1.0, 'acc': False, 'pred': '[INVALID]'}),
    ('dapo', 'Answer: \\boxed{42}', '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', '\\boxed{42}', '42', None, {'score': -1.0, 'acc': False, 'pred': '[INVALID]'}),
    ('dapo', 'answer:42', '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'ANSWER : 42', '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: 42 square units', '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: -5', '-5', None, {'score': 1.0, 'acc': True, 'pred': '-5'}),
    ('dapo', 'Answer: - 5', '-5', None, {'score': 1.0, 'acc': True, 'pred': '-5'}),
    ('dapo', 'Answer: \\frac{1}{2}', '0.5', None, {'score': -1.0, 'acc': False, 'pred': '\\frac{1}{2}'}),
    ('dapo', 'Answer: 42', '\\boxed{42}', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: 42', 42.7, None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: 42<|im_end|>', '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: $4$ and $2$', '4', None, {'score': 1.0, 'acc': True, 'pred': '4'}),
    ('dapo', 'Answer: \\text{42}', '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: 42 degrees', 42, None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: 3.0', '3', None, {'score': -1.0, 'acc': False, 'pred': '3.0'}),
    ('dapo', 'Answer: 1,234,567', 1234567, None, {'score': 1.0, 'acc': True, 'pred': '1234567'}),
    ('dapo', ANSWER_THEN_FILLER, '42', None, {'score': -1.0, 'acc': False, 'pred': '[INVALID]'}),
    ('dapo', LONG_THEN_ANSWER, '42', None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: a 42', 42, None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('dapo', 'Answer: 42^\\circ', 42, None, {'score': 1.0, 'acc': True, 'pred': '42'}),
    ('f1', 'Paris is the capital', 'Paris is the capital', None, 1.0),
    ('f1', 'the brown fox', 'a quick brown fox', None, 0.8),
    ('f1', 'apple banana', 'carrot date', None, 0),
    ('f1', None, 'anything', None, 0),
    ('f1', 'yes', 'some other phrase', None, 0),
    ('f1', 'some other phrase', 'no', None, 0),
    ('f1', 'yes', 'yes', None, 1.0),
    ('f1', 'Yes!', 'yes', None, 1.0),
    ('f1', 'The cat sat.', 'cat sat down', None, 0.8),
    ('f1', 'dog', 'cat', None, 0),
    ('f1', '', '', None, 0),
    ('f1', 'the', 'the', None, 0),
    ('f1', None, None, None, 0),
    ('f1', 'noanswer', 'noanswer', None, 1.0),
    ('f1', 'a.b,c!', 'abc', None, 1.0),
    ('f1', 'An apple, a day', 'apple day', None, 1.0),
    ('f1', 'cat cat cat', 'cat', None, 0.5),
    ('gpqa', 'The answer is C.', 'C', None, 1.0),
    ('gpqa', 'The answer is C.', 'D', None, 0.0),
    ('gpqa', 'Answer: C', 2, {'choices': ['alpha', 'beta', 'gamma', 'delta']}, 1.0),
    ('gpqa', 'Answer: B', 1, {'choices': {'a': 'first', 'b': 'second', 'c': 'third'}}, 1.0),
    (
        'gpqa',
        'I think the answer is B.',
        'capital of france',
        {'choices': ['London', 'Capital of France', 'Berlin']},
        1.0,
    ),
    ('gpqa', 'Definitely paris.', 'Paris', {'choices': ['London', 'Paris', 'Berlin']}, 1.0),
    ('gpqa', 'Answer: A', 'anything', {'correct_letter': 'a'}, 1.0),
    ('gpqa', None, 'A', None, 0.0),
    ('gpqa', 'random text', 'some answer', None, 0.0),
    ('gpqa', 'Let me think… Answer: A is wrong.</think>The answer is B.', 'B', None, 1.0),
    ('gpqa', 'we ruled out A, then B, settled on C', 'C', None, 1.0),
    ('gpqa', 'Answer: C, but actually A was right, no wait B.', 'B', {'valid_letters': ['A', 'B']}, 1.0),
    ('gpqa', '', 'A', None, 0.0),
    ('gpqa', 'Answer: E', 'E', {'choices': ['1', '2', '3', '4']}, 1.0),
    ('gpqa', 'Answer: Z', 'Z', None, 1.0),
    ('gpqa', 'A is correct here', 'A', None, 1.0),
    ('gpqa', 'the final option is C', 'C', None, 1.0),
    ('gpqa', 'Answer: B', 7, None, 0.0),
    ('gpqa', 'Answer: B', -1, None, 0.0),
    ('gpqa', 'Answer: B', 1.9, None, 1.0),
    ('gpqa', 'B', 'b', None, 1.0),
    ('gpqa', 'I pick gamma', 'C', {'choices': ['alpha', 'beta', 'gamma']}, 1.0),
    ('gpqa', 'I pick gamma', None, {'choices': ['alpha', 'beta', 'gamma'], 'correct_letter': 'C'}, 1.0),
    ('gpqa', 'Answer: B', 'beta', {'choices': ['alpha', 'beta'], 'valid_letters': ['X', 'Y']}, 0.0),
    ('gpqa', 'Answer: Y', 'beta', {'choices': ['alpha', 'beta'], 'valid_letters': ['X', 'Y']}, 1.0),
    ('gpqa', 'no letters here', 'Q', None, 0.0),
    ('gpqa', 'Answer: Q', 'Q', None, 1.0),
    ('boxed_f1', 'blah \\boxed{the cat sat}', 'cat sat', None, 1.0),
    ('boxed_f1', 'the cat sat', 'cat sat', None, 0),
    ('boxed_gpqa', '\\boxed{B}', 'B', None, 1.0),
    ('boxed_gpqa', '\\boxed{B}', 'C', None, 0.0),
    ('boxed_math', 'so \\boxed{9}', '8', None, 0),
    ('boxed_math', 'no box 8', '8', None, 0),
    ('boxed_dapo', '34', '34', None, {'score': -1.0, 'acc': False, 'pred': '[INVALID]'}),
    ('boxed_f1', '\\boxed{yes}', 'yes', None, 1.0),
]

# (rm_type, response, label, metadata, slime-ref's failure score, what slime raises)
SLIME_RAISES = [
    ('math', None, '42', None, 0, 'TypeError'),
    ('deepscaler', '</think>\\boxed{42}', None, None, 0, 'AssertionError'),
    ('deepscaler', None, '42', None, 0, 'TypeError'),
    ('deepscaler', '</think>\\boxed{42}', ['42'], None, 0, 'AssertionError'),
    ('dapo', 'Answer: 42', 'forty-two', None, {'score': -1.0, 'acc': False, 'pred': '42'}, 'ValueError'),
    ('dapo', 'Answer: 42', None, None, {'score': -1.0, 'acc': False, 'pred': '42'}, 'ValueError'),
    ('dapo', None, '42', None, {'score': -1.0, 'acc': False, 'pred': '[INVALID]'}, 'TypeError'),
    ('dapo', 'Answer: inf', 'inf', None, {'score': -1.0, 'acc': False, 'pred': 'inf'}, 'OverflowError'),
    ('f1', 'answer', None, None, 0, 'AttributeError'),
    ("gpqa", "Answer: B", float("nan"), None, 0.0, "ValueError"),
    ("gpqa", "Answer: B", float("inf"), None, 0.0, "OverflowError"),
    ("gpqa", "Answer: B", 1, {"choices": 5}, 0.0, "TypeError"),
    ("gpqa", "Answer: B", 1, {"valid_letters": 3}, 0.0, "TypeError"),
]

# (rm_type, response, label, metadata, slime-ref's value, slime's value)
DELIBERATE = [
    ('boxed_math', '\\boxed{\\boxed{8}}', '8', None, 1, 0),
    ('boxed_math', 'so \\boxed{8}', '8', None, 1, 0),
    ('boxed_deepscaler', '</think>\\boxed{0.5}', '1/2', None, 1, 0),
    (
        'boxed_dapo',
        '\\boxed{34}',
        '34',
        None,
        {'score': 1.0, 'acc': True, 'pred': '34'},
        {'score': -1.0, 'acc': False, 'pred': '[INVALID]'},
    ),
    (
        'boxed_dapo',
        '\\boxed{Answer: 34}',
        '34',
        None,
        {'score': -1.0, 'acc': False, 'pred': 'Answer:34'},
        {'score': 1.0, 'acc': True, 'pred': '34'},
    ),
]


def _score(rm_type, response, label, metadata):
    # gpqa may write into the metadata (as slime's does); each case gets its own copy
    return rule_based_reward(rm_type, response, label, copy.deepcopy(metadata))


def _assert_same(ours, expected):
    if isinstance(expected, float):
        assert ours == pytest.approx(expected, abs=1e-12)
    else:
        assert ours == expected
    assert type(ours) is type(expected) or {type(ours), type(expected)} <= {int, float}


@pytest.mark.parametrize("rm_type, response, label, metadata, expected", SLIME_VALUES)
def test_slime_ref_returns_slimes_value(rm_type, response, label, metadata, expected):
    _assert_same(_score(rm_type, response, label, metadata), expected)


@pytest.mark.parametrize("rm_type, response, label, metadata, failure_score, slime_raises", SLIME_RAISES)
def test_where_slime_raises_slime_ref_returns_the_failure_score(
    rm_type, response, label, metadata, failure_score, slime_raises
):
    _assert_same(_score(rm_type, response, label, metadata), failure_score)
    score = failure_score["score"] if isinstance(failure_score, dict) else failure_score
    assert score == (-1.0 if rm_type == "dapo" else 0)


@pytest.mark.parametrize("rm_type, response, label, metadata, ours, slimes", DELIBERATE)
def test_deliberate_differences_are_only_the_boxed_prefix(rm_type, response, label, metadata, ours, slimes):
    assert rm_type.startswith("boxed_")  # anything else must match slime (the table lists only this)
    assert ours != slimes
    _assert_same(_score(rm_type, response, label, metadata), ours)


def test_the_corpus_covers_each_rule_right_and_wrong():
    for rm_type in ("math", "deepscaler", "dapo", "f1", "gpqa"):
        values = [v["score"] if isinstance(v, dict) else v for r, *_, v in SLIME_VALUES if r == rm_type]
        assert len(values) >= 15, rm_type
        assert max(values) == 1 and min(values) <= 0, rm_type
    responses = {response for _, response, *_ in SLIME_VALUES}
    assert "" in responses and None in responses
