"""Reading launch scripts the way bash would, without running anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime_check.launch_script import ScriptError, read_script
from slime_check.shell_expansion import arithmetic

SCRIPTS = Path(__file__).parents[1] / "fixtures" / "slime_scripts"


def argv_of(path, **kw) -> list[str]:
    reading = read_script(path, **kw)
    assert len(reading.invocations) == 1, reading
    return [w.text for w in reading.invocations[0].argv]


def write(tmp_path, text: str, name: str = "run.sh") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_fixture_colocate_script():
    reading = read_script(SCRIPTS / "scripts" / "run-tiny-colocate.sh")
    (inv,) = reading.invocations
    argv = [w.text for w in inv.argv]
    assert inv.entry == "train.py" and not inv.conditional
    assert argv[:6] == ["--actor-num-nodes", "1", "--actor-num-gpus-per-node", "4", "--num-gpus-per-node", "4"]
    # the sourced model script, defaults, arithmetic and commented-out lines
    assert argv[argv.index("--num-layers") + 1] == "2"
    assert argv[argv.index("--rotary-base") + 1] == "1000000"
    assert argv[argv.index("--update-weight-buffer-size") + 1] == str(512 * 1024 * 1024)
    assert argv[argv.index("--hf-checkpoint") + 1] == "/root/qwen3-tiny"
    assert argv.count("--hf-checkpoint") == 1  # the commented-out FP8 line is not there
    assert "--micro-batch-size" not in argv
    assert reading.sourced == [str((SCRIPTS / "scripts" / "models" / "qwen3-tiny.sh").resolve())]
    where = {w.text: w.origin for w in inv.argv}
    assert where["--eps-clip-high"].line == 71 and Path(where["--eps-clip-high"].file).name == "run-tiny-colocate.sh"
    assert Path(where["--qk-layernorm"].file).name == "qwen3-tiny.sh"


def test_env_overrides_defaults():
    argv = argv_of(SCRIPTS / "scripts" / "run-tiny-colocate.sh", env={"NUM_GPUS": "8", "HF_DIR": "/data/tiny"})
    assert argv[3] == "8" and argv[argv.index("--hf-checkpoint") + 1] == "/data/tiny"


def test_source_relative_to_slime_dir():
    reading = read_script(SCRIPTS / "run-tiny-async.sh", slime_dir=SCRIPTS)
    assert reading.invocations[0].entry == "train_async.py" and not reading.notes
    argv = [w.text for w in reading.invocations[0].argv]
    assert "--swiglu" in argv and "--prompt-data" in argv  # MODEL_ARGS and the += array


def test_script_folder_idioms(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.sh").write_text("MODEL_ARGS=(--num-layers 3)\n")
    (tmp_path / "examples" / "x").mkdir(parents=True)
    path = write(tmp_path / "examples" / "x", """
ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." &>/dev/null && pwd)"
source "${ROOT}/models/m.sh"
python3 "${ROOT}/train.py" ${MODEL_ARGS[@]}
""")
    assert argv_of(path) == ["--num-layers", "3"]


def test_another_machines_path_is_read_from_slime_dir(tmp_path):
    path = write(tmp_path, "source /root/slime/scripts/models/qwen3-tiny.sh\npython train.py ${MODEL_ARGS[@]}\n")
    reading = read_script(path, slime_dir=SCRIPTS)
    assert not reading.notes and reading.substituted and "--swiglu" in [w.text for w in reading.invocations[0].argv]


def test_missing_source_is_a_note(tmp_path):
    path = write(tmp_path, "source scripts/models/nope.sh\npython3 train.py --lr 1\n")
    reading = read_script(path)
    assert "not found" in reading.notes[0] and "--slime-dir" in reading.notes[0]
    assert [w.text for w in reading.invocations[0].argv] == ["--lr", "1"]


def test_quoting_expansion_and_splitting(tmp_path):
    path = write(tmp_path, r"""
A=( --a "two words" 'x y' )
EMPTY=()
B="--b 1"
C=${UNSET_VAR:-"dflt"}
python train.py "${A[@]}" "${EMPTY[@]}" $B --c "$C" --d ${C}x --e "a\"b" --f $(hostname) --g "${A[*]}"
""")
    argv = argv_of(path)
    assert argv == ["--a", "two words", "x y", "--b", "1", "--c", "dflt", "--d", "dfltx", "--e", 'a"b',
                    "--f", "$(hostname)", "--g", "--a two words x y"]
    inv = read_script(path).invocations[0]
    assert not inv.argv[argv.index("--f") + 1].known


def test_unquoted_array_splits_elements(tmp_path):
    argv = argv_of(write(tmp_path, 'A=(--x "1 2")\npython train.py ${A[@]}\n'))
    assert argv == ["--x", "1", "2"]


def test_line_continuations_comments_and_heredocs(tmp_path):
    path = write(tmp_path, """
cat > /tmp/cfg.yaml <<CFG
python train.py --inside-heredoc
CFG
JSON=$(cat <<'EOF'
{"a": "it's fine"}
EOF
)
python3 -u \\
   train.py \\
   --one 1 \\
   # a comment line ends the command in bash too
   --two 2
""")
    reading = read_script(path)
    assert [w.text for w in reading.invocations[0].argv] == ["--one", "1"]
    assert reading.orphans and reading.orphans[0].words[0].text == "--two"
    assert reading.orphans[0].origin.line == 13


def test_undecided_branches_merge(tmp_path):
    path = write(tmp_path, """
N=$(nvidia-smi -L | wc -l)
if [ "$N" -gt 0 ]; then
   X=1; SAME=yes
else
   X=2; SAME=yes
fi
python train.py --x $X --same $SAME
""")
    inv = read_script(path).invocations[0]
    assert [w.text for w in inv.argv][2:] == ["--same", "yes"] and not inv.argv[1].known


def test_decided_branch_and_guard_exit(tmp_path):
    path = write(tmp_path, """
MODE=${MODE:-async}
if [ -z "${BASE:-}" ]; then
  echo "BASE is not set"; exit 1
fi
if [ "$MODE" = "async" ]; then
  ENTRY=train_async.py
elif [ "$MODE" = "sync" ]; then
  ENTRY=train.py
fi
python3 $ENTRY --n 1
exit 0
python3 train.py --never
""")
    reading = read_script(path)
    assert [(i.entry, [w.text for w in i.argv]) for i in reading.invocations] == [("train_async.py", ["--n", "1"])]


def test_loops_make_their_variables_unknown(tmp_path):
    path = write(tmp_path, """
arr=()
for ((i=0; i<4; i++)); do
  arr+=(1)
done
printf -v FREQ "[%s]" "$(IFS=', '; echo "${arr[*]}")"
python train.py --moe-layer-freq "$FREQ" --k "${arr[@]}"
""")
    inv = read_script(path).invocations[0]
    assert [w.known for w in inv.argv] == [True, False, True, False]


def test_case_blocks_are_noted(tmp_path):
    path = write(tmp_path, 'case "$M" in\n  a) X=1 ;;\n  *) X=2 ;;\nesac\npython train.py --x $X\n')
    reading = read_script(path)
    assert "case block is not followed; X (set in it)" in reading.notes[0]
    assert not reading.invocations[0].argv[1].known
    # a guard that only checks and exits sets nothing: no flag is unknown, nothing to note
    guard = write(tmp_path, 'case "$N" in\n  1|2) ;;\n  *) echo bad >&2; exit 2 ;;\nesac\npython train.py --x 1\n',
                  "guard.sh")
    assert read_script(guard).notes == []


def test_functions_are_called(tmp_path):
    path = write(tmp_path, "launch() {\n  python train.py --from-function 1\n}\nlaunch\n")
    assert argv_of(path) == ["--from-function", "1"]


def test_unparseable_scripts_raise(tmp_path):
    with pytest.raises(ScriptError, match="unterminated"):
        read_script(write(tmp_path, 'python train.py --x "open\n'))
    with pytest.raises(ScriptError, match="fi"):
        read_script(write(tmp_path, "if true; then\n  echo\n"))
    with pytest.raises(ScriptError, match="unexpected"):
        read_script(write(tmp_path, "echo a\nfi\npython train.py\n"))  # a stray keyword, not a hang
    with pytest.raises(ScriptError, match="unexpected"):
        read_script(write(tmp_path, "echo a )\n"))
    with pytest.raises(ScriptError):
        read_script(tmp_path / "absent.sh")


@pytest.mark.parametrize(
    "expr,value",
    [
        ("1024 * 1024 * 2", 2097152),
        ("(3 + 4) % 5", 2),
        ("7 / 2", 3),
        ("2 ** 10", 1024),
        ("x + 1", None),
        ("1 / 0", None),
    ],
)
def test_arithmetic(expr, value):
    assert arithmetic(expr) == value


@pytest.mark.parametrize("command, entry", [("train", "train.py"), ("train-async", "train_async.py")])
def test_slime_ref_commands_are_entry_points(tmp_path, command, entry):
    path = write(tmp_path, f"ARGS=(--lr 1e-6\n  --colocate)\nslime-ref {command} \\\n  \"${{ARGS[@]}}\" --seed 3\n")
    (inv,) = read_script(path).invocations
    assert inv.entry == entry
    assert [w.text for w in inv.argv] == ["--lr", "1e-6", "--colocate", "--seed", "3"]


def test_other_slime_ref_commands_are_not_entry_points(tmp_path):
    assert read_script(write(tmp_path, "slime-ref plot run/\n")).invocations == []


def test_ray_job_submits_runtime_env_vars_reach_the_invocation(tmp_path):
    # slime's scripts put Megatron-LM and the user's hook folders on PYTHONPATH in the job's runtime env;
    # Ray sets those for the driver and every worker, over what the shell exported
    path = write(tmp_path, 'export PYTHONPATH=/from/shell MY_VAR=kept\nMEGATRON_DIR=/root/Megatron-LM\n'
                 'RUNTIME_ENV_JSON="{\n  \\"env_vars\\": {\n    \\"PYTHONPATH\\": \\"${MEGATRON_DIR}:/hooks\\",\n'
                 '    \\"CUDA_DEVICE_MAX_CONNECTIONS\\": \\"1\\"\n  }\n}"\n'
                 'ray job submit --address="http://127.0.0.1:8265" \\\n   --runtime-env-json="${RUNTIME_ENV_JSON}" \\\n'
                 '   -- python3 train.py --lr 1e-6\n')
    (inv,) = read_script(path).invocations
    assert inv.env == {"PYTHONPATH": "/root/Megatron-LM:/hooks", "MY_VAR": "kept", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert [w.text for w in inv.argv] == ["--lr", "1e-6"]
    # the flag and its value as two words; a value that is not JSON adds nothing
    two = write(tmp_path, "ray job submit --runtime-env-json '{\"env_vars\": {\"A\": \"1\"}}' -- python3 train.py\n"
                "ray job submit --runtime-env-json='not json' -- python3 train.py\n", "two.sh")
    first, second = read_script(two).invocations
    assert first.env == {"A": "1"} and second.env == {}


def test_basename_of_a_known_word(tmp_path):
    # geo3k_vlm's idiom: a dataset's local folder is named after the last part of its hub name
    path = write(tmp_path, r"""
DATASET_NAME=${SLIME_SCRIPT_DATASET_NAME:-"chenhegu/geo3k_imgurl"}
DATASET_LOCAL_NAME=$(basename "$DATASET_NAME")
python train.py --prompt-data /root/datasets/${DATASET_LOCAL_NAME}/train.parquet --a $(basename -- /x/m.sh .sh) \
  --b $(basename "$UNSET_VAR") --c $(basename "dir/") --d $(basename .sh .sh)
""")
    argv = argv_of(path)
    assert argv == ["--prompt-data", "/root/datasets/geo3k_imgurl/train.parquet", "--a", "m",
                    "--b", "$(basename \"$UNSET_VAR\")", "--c", "dir", "--d", ".sh"]
    inv = read_script(path).invocations[0]
    assert inv.argv[1].known and not inv.argv[5].known
