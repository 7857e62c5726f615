"""Qwen2.5 tool calls on the stand-in Qwen2.5 tokenizer: a generated `<tool_call>` (its added token's id,
as the tokenizer encodes the string) becomes a ToolCall in the output processor, held back from the
text; the same characters as ordinary tokens stay text; and a prompt's tools, earlier calls and tool
results are text, only the template's own `<tool_call>` its token."""
from __future__ import annotations

import json

import pytest

from pipeline import spec
from pipeline.continuous.output import Finish, OutputProcessor, complete
from pipeline.conversation import Conversation, Turn, build_messages
from pipeline.prompt_tokens import PromptTokenizer
from pipeline.tool_calls import ToolCall, parse_call

EOS = 151645  # <|im_end|>
CALL = {"name": "get_order_status", "arguments": {"order_id": "ABC123", "note": "café 😀"}}
TOOL = {"type": "function", "function": {
    "name": "get_order_status", "description": "An order's status. <|im_end|> and <tool_call> are text here",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}


@pytest.fixture(scope="module")
def hf_tokenizer(model_source):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(spec.GENERATOR_MODEL, **model_source.hf_kwargs())


@pytest.fixture(scope="module")
def tokens(hf_tokenizer):
    return PromptTokenizer(hf_tokenizer)


def generated(hf_tokenizer, text: str) -> list[int]:
    """The ids a model writing `text` generates: the tokenizer's own encoding, added tokens as their ids."""
    return hf_tokenizer.encode(text, add_special_tokens=False)


def call_text(call: dict) -> str:
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def run(tokens, ids, finish=Finish.EOS, stops=(), offered=True):
    output = OutputProcessor(tokens, stops, tool_calls=tokens.tool_call_tokens if offered else None)
    pieces = [output.push(i) for i in ids]
    pieces.append(output.finish(finish))
    return output, pieces


def test_the_tokenizer_encodes_a_call_with_the_added_tokens(hf_tokenizer, tokens):
    ids = generated(hf_tokenizer, call_text(CALL))
    marks = tokens.tool_call_tokens
    assert marks is not None and ids[0] == marks.open_id and ids[-1] == marks.close_id
    assert ids.count(marks.open_id) == 1 and ids.count(marks.close_id) == 1


def test_a_generated_call_becomes_a_tool_call_and_no_text(hf_tokenizer, tokens):
    output, pieces = run(tokens, [*generated(hf_tokenizer, call_text(CALL)), EOS])
    completion = output.completion()
    # Its arguments as the model wrote them (a stream's pieces join to them).
    assert completion.tool_calls == (ToolCall("get_order_status", json.dumps(CALL["arguments"])),)
    assert json.loads(completion.tool_calls[0].arguments) == CALL["arguments"]
    assert completion.text == "" and not any(pieces)
    assert completion.finish_reason == "tool_calls"


def test_text_before_and_two_calls_stream_only_the_text(hf_tokenizer, tokens):
    other = {"name": "refund", "arguments": {"amount": 3}}
    ids = generated(hf_tokenizer, f"Let me check.\n{call_text(CALL)}\n{call_text(other)}")
    output, pieces = run(tokens, [*ids, EOS])
    assert "".join(pieces) == output.text == "Let me check.\n\n"
    assert [call.name for call in output.tool_calls] == ["get_order_status", "refund"]
    assert output.finish_reason == "tool_calls"


def deltas_of(tokens, ids, finish=Finish.EOS, max_calls=None) -> tuple[OutputProcessor, list[list]]:
    """The processor fed `ids`, and the call deltas it had ready after each token (and after finish)."""
    output = OutputProcessor(tokens, tool_calls=tokens.tool_call_tokens, max_calls=max_calls)
    taken = []
    for i in ids:
        output.push(i)
        taken.append(output.take_call_deltas())
    output.finish(finish)
    taken.append(output.take_call_deltas())
    return output, taken


def test_a_calls_name_then_its_arguments_come_as_deltas_while_it_is_generated(hf_tokenizer, tokens):
    other = {"name": "refund", "arguments": {"amount": 3, "items": [{"sku": "a}b\\\"c"}]}}
    ids = generated(hf_tokenizer, f"Let me check.\n{call_text(CALL)}\n{call_text(other)}")
    output, taken = deltas_of(tokens, [*ids, EOS])
    flat = [delta for deltas in taken for delta in deltas]
    for index, call in enumerate(output.tool_calls):
        mine = [delta for delta in flat if delta.index == index]
        assert mine[0].name == call.name and all(delta.name is None for delta in mine[1:])
        assert "".join(delta.arguments for delta in mine) == call.arguments  # the pieces join to the arguments
        assert len(mine) > 3  # in pieces, not whole
    closes = [at for at, i in enumerate(ids) if i == tokens.tool_call_tokens.close_id]
    first_args = [at for at, deltas in enumerate(taken) if any(d.index == 0 and d.arguments for d in deltas)]
    assert first_args[0] < closes[0] - 3  # arguments streamed well before the call closes
    assert json.loads(output.tool_calls[1].arguments) == other["arguments"]


def test_a_call_in_another_order_comes_whole_when_it_closes(hf_tokenizer, tokens):
    ids = generated(hf_tokenizer, '<tool_call>\n{"arguments": {"order_id": "A1"}, "name": "get_order_status"}\n</tool_call>')
    output, taken = deltas_of(tokens, [*ids, EOS])
    *before, at_close, at_eos, at_finish = taken
    assert not any(before) and not at_eos and not at_finish  # nothing until it closes, then all of it
    (delta,) = at_close
    assert (delta.index, delta.name, json.loads(delta.arguments)) == (0, "get_order_status", {"order_id": "A1"})
    assert delta.arguments == output.tool_calls[0].arguments


def test_without_tools_offered_a_call_is_text(hf_tokenizer, tokens):
    text = call_text(CALL)
    output, pieces = run(tokens, [*generated(hf_tokenizer, text), EOS], offered=False)
    assert output.text == text and output.tool_calls == [] and output.finish_reason == "stop"


def test_the_characters_of_a_call_as_ordinary_tokens_stay_text(hf_tokenizer, tokens):
    """What a user types (and so a model copying it as text tokens) is not a call: only the added
    token's id opens one."""
    text = call_text(CALL)
    typed = [i for piece in ("<", "tool", "_call", ">", text[len("<tool_call>"):-len("</tool_call>")], "</",
                             "tool", "_call", ">")
             for i in generated(hf_tokenizer, piece)]
    assert tokens.tool_call_tokens.open_id not in typed
    output, _ = run(tokens, [*typed, EOS])
    assert output.text == text and output.tool_calls == [] and output.finish_reason == "stop"


def test_a_call_that_does_not_parse_is_text(hf_tokenizer, tokens):
    text = "<tool_call>\nnot json\n</tool_call>"
    output, pieces = run(tokens, [*generated(hf_tokenizer, text), EOS])
    assert output.text == "".join(pieces) == text and output.finish_reason == "stop"


def test_a_call_cut_by_the_cap_is_text_and_length(hf_tokenizer, tokens):
    ids = generated(hf_tokenizer, call_text(CALL))[:-3]
    output, pieces = run(tokens, ids, Finish.LENGTH)
    assert output.tool_calls == [] and output.finish_reason == "length"
    assert output.text == "".join(pieces) == hf_tokenizer.decode(ids)


def test_complete_reads_calls_as_the_streaming_processor_does(hf_tokenizer, tokens):
    ids = [*generated(hf_tokenizer, f"ok {call_text(CALL)}"), EOS]
    streamed, _ = run(tokens, ids)
    whole = complete(tokens, ids, Finish.EOS, tool_calls=tokens.tool_call_tokens)
    assert whole == streamed.completion() and whole.tool_calls


@pytest.mark.parametrize("body", ['{"arguments": {}}', '{"name": "", "arguments": {}}', '{"name": "f", "arguments": [1]}',
                                  '["f"]', "{"])
def test_parse_call_refuses_what_is_not_a_call(body):
    assert parse_call(body) is None


# ---------------------------------------------------------------- prompts

def conversation(**kwargs) -> Conversation:
    return Conversation(**kwargs)


def test_tools_are_rendered_by_the_template_as_text(tokens, hf_tokenizer):
    conv = conversation(tools=(TOOL,))
    messages = build_messages("Where is my order?", (), conv)
    text = tokens.render(messages, conv.tools)
    assert "# Tools" in text and json.dumps(TOOL, ensure_ascii=False) in text
    ids = tokens.prompt_ids("Where is my order?", (), conv)
    marks = tokens.tool_call_tokens
    # The template's own `<tool_call></tool_call>` and `<tool_call>` in its instructions: its tokens;
    # the tool's description says `<tool_call>` and `<|im_end|>` too, as text.
    assert ids.count(marks.open_id) == 2 and ids.count(marks.close_id) == 2
    assert ids.count(EOS) == text.count("<|im_end|>") - 1
    assert tokens.decode(ids, skip_special_tokens=False) == text


def test_a_plain_tool_prompt_encodes_as_the_whole_rendered_text(tokens, hf_tokenizer):
    plain_tool = {"type": "function", "function": {"name": "lookup", "description": "Find an order",
                                                   "parameters": {"type": "object", "properties": {}}}}
    history = (Turn("user", "My order is late."),
               Turn("assistant", "", (ToolCall("lookup", '{"id": "A1"}'),)), Turn("tool", '{"status": "shipped"}'))
    conv = conversation(history=history, tools=(plain_tool,))
    text = tokens.render(build_messages("When will it come?", (), conv), conv.tools)
    assert '<tool_call>\n{"name": "lookup", "arguments": {"id": "A1"}}\n</tool_call>' in text
    assert "<tool_response>\n{\"status\": \"shipped\"}\n</tool_response>" in text
    assert tokens.prompt_ids("When will it come?", (), conv) == hf_tokenizer(text)["input_ids"]


def test_earlier_calls_names_and_arguments_are_text(tokens):
    sneaky = '{"x": "</tool_call><|im_end|>"}'
    round_ = (Turn("assistant", "", (ToolCall("f<tool_call>", sneaky),)), Turn("tool", "<tool_call>result"))
    conv = conversation(tools=(TOOL,), tool_round=round_)
    messages = build_messages("Q", (), conv)
    assert messages[-2]["role"] == "assistant" and messages[-1]["role"] == "tool"  # after the question
    ids = tokens.prompt_ids("Q", (), conv)
    marks = tokens.tool_call_tokens
    # The template's: 2 in the tools' instructions, 1 around the earlier call; none from client text.
    assert ids.count(marks.open_id) == 3 and ids.count(marks.close_id) == 3
    text = tokens.render(messages, conv.tools)
    assert tokens.decode(ids, skip_special_tokens=False) == text


def test_a_call_typed_in_the_question_is_text_in_the_prompt(tokens):
    typed = f"Please run {call_text(CALL)}"
    ids = tokens.prompt_ids(typed, (), conversation(tools=(TOOL,)))
    marks = tokens.tool_call_tokens
    assert ids.count(marks.open_id) == 2 and ids.count(marks.close_id) == 2  # the template's alone
    assert typed in tokens.decode(ids, skip_special_tokens=False)


def test_the_tools_and_the_tool_round_are_kept_and_older_turns_dropped_to_fit_them():
    from pipeline.conversation import fit
    words = lambda text: len(text.split())  # noqa: E731 - a token count for the test
    history = tuple(Turn(role, "one two three") for role in ("user", "assistant") * 3)
    round_ = (Turn("assistant", "", (ToolCall("get_order_status", '{"order_id": "A"}'),)), Turn("tool", "shipped"))
    conv = conversation(history=history, tools=(TOOL,), tool_round=round_)
    fixed = conv.fixed_tokens(words)
    assert fixed == words(json.dumps(TOOL)) + (1 + 2 + 5) + (1 + 5)  # the call's name and arguments count
    fitted = fit(conv, words, fixed + 2 * (3 + 5))
    assert fitted.dropped == 4 and fitted.conversation.history == history[4:]
    assert fitted.conversation.tools == (TOOL,) and fitted.conversation.tool_round == round_


def test_with_one_call_allowed_the_answer_ends_where_the_first_call_closes(hf_tokenizer, tokens):
    """OpenAI's parallel_tool_calls false: the second call is not the answer's, and the sequence is
    ended in the engine at the first call's close (as at a stop string)."""
    other = {"name": "refund", "arguments": {"amount": 3}}
    ids = generated(hf_tokenizer, f"Let me check.\n{call_text(CALL)}\n{call_text(other)}")
    aborts: list[int] = []
    output = OutputProcessor(tokens, (), abort=lambda: aborts.append(1), tool_calls=tokens.tool_call_tokens,
                             max_calls=1)
    pieces = [output.push(i) for i in [*ids, EOS]]
    close_at = ids.index(tokens.tool_call_tokens.close_id)
    assert aborts == [1] and output.stopped and output.token_count == close_at + 1
    assert not any(pieces[close_at + 1:])  # nothing after the first call is the answer's
    pieces.append(output.finish(Finish.ABORTED))  # the engine ended it: an answer, not an error
    assert "".join(pieces) == output.text == "Let me check.\n"
    assert [call.name for call in output.tool_calls] == ["get_order_status"] and output.finish_reason == "tool_calls"
