"""Bad input and a failing disk end as one `Error:` line on stderr and exit status 1, never a traceback."""

from __future__ import annotations

import copy
import errno
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from t2s.commands import main
from t2s.settings import REPO_ROOT


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("Error: ") and "Traceback" not in err[0]
    return err[0]


def _eval(demo_dir, output, *extra):
    return ["eval", "--policy", "gold", "--data", str(demo_dir), "--n", "3", "--output", str(output), "--quiet", *extra]


def test_an_output_path_that_is_a_file(demo_dir, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    assert main(_eval(demo_dir, taken)) == 1
    assert str(taken) in _one_error_line(capsys) and taken.read_text() == "keep me"
    data = demo_dir / "dev.json"
    predictions = tmp_path / "p.jsonl"
    first = json.loads(data.read_text())[0]["question_id"]  # a prediction of the data: the output is what fails
    predictions.write_text(json.dumps({"question_id": first, "sql": "SELECT 1"}))
    assert main(["score", "--data", str(data), "--predictions", str(predictions), "--output", str(taken)]) == 1
    assert "is a file" in _one_error_line(capsys) and taken.read_text() == "keep me"


def test_a_read_only_output_folder(demo_dir, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: make creating the folder fail as it does for a user
        real_mkdir = pathlib.Path.mkdir

        def refused(self, *args, **kwargs):
            if str(self).startswith(str(folder)):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(pathlib.Path, "mkdir", refused)
    try:
        assert main(_eval(demo_dir, folder / "out")) == 1
        line = _one_error_line(capsys)
        assert "Permission denied" in line and str(folder / "out") in line
    finally:
        folder.chmod(0o755)


def test_a_full_disk_keeps_what_was_written(demo_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    real_write_text = pathlib.Path.write_text

    def full(self, *args, **kwargs):
        if self.name == "summary.json":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    assert main(_eval(demo_dir, out)) == 1
    line = _one_error_line(capsys)
    assert "No space left on device" in line and "summary.json" in line
    assert len((out / "full" / "episodes.jsonl").read_text().splitlines()) == 3  # nothing played is lost
    monkeypatch.setattr(pathlib.Path, "write_text", real_write_text)
    assert main(_eval(demo_dir, out)) == 0  # the disk has room again: the run resumes and finishes
    assert json.loads((out / "summary.json").read_text())["modes"]["full"]["n"] == 3


def test_a_full_disk_through_the_command_line(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    out = tmp_path / "out"
    out.mkdir()
    (out / "compare.json").symlink_to("/dev/full")  # the report lands on a full disk
    done = subprocess.run([sys.executable, "-m", "t2s", "compare", "a", "b", "--output", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    # the runs are missing: the error names them before anything is written
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [done.stderr.strip()]
    run = tmp_path / "run.jsonl"
    run.write_text("\n".join(json.dumps({"question_id": str(i), "official": i % 2}) for i in range(6)))
    done = subprocess.run([sys.executable, "-m", "t2s", "compare", str(run), str(run), "--output", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"Error: No space left on device: {out / 'compare.json'}"


def test_a_system_prompt_file_that_is_not_utf8(demo_dir, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(b"\xff\xfe not utf-8 \x80")
    assert main(_eval(demo_dir, tmp_path / "out", "--system-prompt-file", str(prompt))) == 1
    line = _one_error_line(capsys)
    assert str(prompt) in line and "not UTF-8" in line
    assert not (tmp_path / "out").exists()
    turns = tmp_path / "turns.jsonl"
    turns.write_text(json.dumps("SELECT 1") + "\n")
    db = demo_dir / "dev_databases" / "village_library" / "village_library.sqlite"
    code = main(["ask", "--db", str(db), "--replay", str(turns), "--system-prompt-file", str(prompt), "how many?"])
    assert code != 0 and "not UTF-8" in _one_error_line(capsys)


def test_an_empty_system_prompt_file_is_refused_by_eval_and_ask_as_by_train(demo_dir, tmp_path, capsys):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(" \n\t\n")
    assert main(_eval(demo_dir, tmp_path / "out", "--system-prompt-file", str(prompt))) == 1
    assert _one_error_line(capsys) == f"Error: system prompt file is empty: {prompt}"
    assert not (tmp_path / "out").exists()
    turns = tmp_path / "turns.jsonl"
    turns.write_text(json.dumps("SELECT 1") + "\n")
    db = demo_dir / "dev_databases" / "village_library" / "village_library.sqlite"
    code = main(["ask", "--db", str(db), "--replay", str(turns), "--system-prompt-file", str(prompt), "how many?"])
    assert code == 1 and _one_error_line(capsys) == f"Error: system prompt file is empty: {prompt}"


@pytest.mark.parametrize("kind", ["fifo", "folder", "huge"])
def test_a_prompt_or_template_file_that_is_no_regular_file_or_too_large_is_refused_unread(demo_dir, tmp_path, capsys,
                                                                                          kind):
    """A FIFO would wait for a writer for ever, and a folder or a file of many megabytes is no prompt: one line, read
    by nothing (the test would hang on a FIFO that is opened)."""
    import os

    prompt = tmp_path / "prompt.txt"
    if kind == "fifo":
        os.mkfifo(prompt)
    elif kind == "folder":
        prompt.mkdir()
    else:
        prompt.write_text("x" * (5 << 20))
    expected = {"fifo": "is not a regular file (a pipe or a device)", "folder": "is a folder, not a file",
                "huge": "is larger than 4 MiB"}[kind]
    assert main(_eval(demo_dir, tmp_path / "out", "--system-prompt-file", str(prompt))) == 1  # read as train reads it
    assert _one_error_line(capsys) == f"Error: system prompt file {expected}: {prompt}"
    assert not (tmp_path / "out").exists()
    from t2s.errors import FileError, read_text_file

    with pytest.raises(FileError, match="^" + re.escape(f"Error: chat template file {expected}: {prompt}") + "$"):
        read_text_file(prompt, what="chat template file")


def test_a_byte_order_mark_never_reaches_a_prompt_or_template(tmp_path, tiny_tokenizer):
    """Windows editors save UTF-8 with a byte-order mark; U+FEFF is no whitespace, so it would open the system prompt
    (or the chat template's output) of every episode."""
    from t2s.env.chat_format import apply_chat_template_file
    from t2s.env.protocol import system_prompt
    from t2s.evaluation.config import read_system_prompt

    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes("\ufeffYou write SQL.\n".encode())
    assert system_prompt(path=prompt) == read_system_prompt(prompt) == "You write SQL."
    template = tmp_path / "template.jinja"
    template.write_bytes("\ufeff{% for m in messages %}{{ m['content'] }}{% endfor %}".encode())
    tokenizer = apply_chat_template_file(copy.deepcopy(tiny_tokenizer), template)
    assert not tokenizer.chat_template.startswith("\ufeff")


def test_a_password_in_a_connection_string_is_never_shown(demo_dir, tmp_path, capsys):
    dsn = "host=127.0.0.1 port=1 password=S3cretPW dbname=x"
    code = main(["ask", "--db", dsn, "--replay", str(tmp_path / "none.jsonl"), "how many?"])
    line = _one_error_line(capsys)
    assert code == 1 and "S3cretPW" not in line and "password=***" in line and "key-value connection string" in line
    assert main(_eval(demo_dir, tmp_path / "out", "--engine", "postgres", "--dsn", dsn)) == 1
    line = _one_error_line(capsys)
    assert "S3cretPW" not in line and "password=***" in line
    named = tmp_path / "passwords.sqlite"  # a file's name, not a connection string
    assert main(["ask", "--db", str(named), "--replay", str(tmp_path / "none.jsonl"), "how many?"]) == 1
    assert _one_error_line(capsys) == f"Error: database file not found: {named}"


def test_eval_and_score_never_write_into_each_others_folders(demo_dir, tmp_path, capsys):
    data = demo_dir / "dev.json"
    predictions = tmp_path / "p.jsonl"
    first = json.loads(data.read_text())[0]["question_id"]
    predictions.write_text(json.dumps({"question_id": first, "sql": "SELECT 1"}))
    evaluated, scored = tmp_path / "eval", tmp_path / "score"
    assert main(_eval(demo_dir, evaluated)) == 0
    assert main(["score", "--data", str(data), "--predictions", str(predictions), "--output", str(scored)]) == 0
    capsys.readouterr()
    kept = {folder: (folder / "summary.json").read_text() for folder in (evaluated, scored)}
    assert main(["score", "--data", str(data), "--predictions", str(predictions), "--output", str(evaluated)]) == 1
    assert _one_error_line(capsys).startswith(f"Error: {evaluated} holds an eval (modes full), whose")
    mode_folder = evaluated / "full"
    kept[mode_folder] = (mode_folder / "scores.jsonl").read_text()
    assert main(["score", "--data", str(data), "--predictions", str(predictions), "--output", str(mode_folder)]) == 1
    assert _one_error_line(capsys).startswith(f"Error: {mode_folder} holds an eval's episodes, whose files")
    assert main(_eval(demo_dir, scored)) == 1
    assert _one_error_line(capsys).startswith(f"Error: {scored} holds a score run (scores.jsonl at the top)")
    assert {folder: (folder / "summary.json").read_text() for folder in (evaluated, scored)} == \
        {folder: kept[folder] for folder in (evaluated, scored)}
    assert (mode_folder / "scores.jsonl").read_text() == kept[mode_folder]
    assert not (mode_folder / "summary.json").exists()


@pytest.mark.parametrize("model", ["./no/such/model", "/no/such/model", "~/no/such/model", "a/b/c"])
def test_a_model_folder_that_is_not_there_is_named_and_no_output_folder_is_left(demo_dir, tmp_path, capsys, model):
    assert main(_eval(demo_dir, tmp_path / "out", "--policy", "model", "--model", model)) == 1
    assert _one_error_line(capsys).startswith(f"Error: model or tokenizer folder not found: {model} (")
    assert not (tmp_path / "out").exists()  # the run made it, and left it empty: it is gone again


HEAVY_IMPORTS_SCRIPT = ("import sys\nfrom t2s.commands import main\ncode = main(sys.argv[1:])\n"
                        "print(sorted(set(sys.modules) & {'torch', 'transformers', 'trl', 'vllm'}))\nsys.exit(code)\n")


@pytest.mark.parametrize("policy", ["model", "vllm"])
def test_a_missing_model_is_told_before_torch_or_vllm_is_imported(demo_dir, tmp_path, policy):
    """A mistyped --model is answered at once, not after the seconds torch's and vLLM's imports take."""
    done = subprocess.run([sys.executable, "-c", HEAVY_IMPORTS_SCRIPT, *_eval(demo_dir, tmp_path / "out", "--policy",
                                                                             policy, "--model", "/no/such/model")],
                          capture_output=True, text=True, timeout=300, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.startswith("Error: model or tokenizer folder not found: /no/such/model ("), done.stderr
    assert done.stdout.strip() == "[]"


def test_a_symlink_loop_is_one_line(demo_dir, tmp_path, capsys):
    loop = tmp_path / "dbs"
    loop.symlink_to(loop)  # a link to itself: resolving it never ends
    assert main(_eval(demo_dir, tmp_path / "out", "--db-root", str(loop))) == 1
    assert _one_error_line(capsys) == f"Error: a path is a loop of symbolic links: {loop}"
    assert main(["export", "--checkpoint", str(loop), "--output", str(tmp_path / "export")]) == 1
    assert "a path is a loop of symbolic links" in _one_error_line(capsys)
    assert not (tmp_path / "export").exists()
    from t2s.errors import error_line, user_facing

    later = OSError(errno.ELOOP, "Too many levels of symbolic links", str(loop))  # what Python 3.13's resolve raises
    assert user_facing(later) and error_line(later) == f"Error: a path is a loop of symbolic links: {loop}"


def test_a_home_of_no_user_and_an_unreadable_server_url_are_one_line(demo_dir, tmp_path, capsys):
    """``~NAME`` for a user the machine does not have (pathlib raises RuntimeError), wherever a path is taken, and a
    PostgreSQL URL that cannot be read ("Invalid IPv6 URL", said without the password the URL holds)."""
    nobody = "~t2s-no-such-user-here/db.sqlite"
    assert main(["ask", "a question", "--db", nobody, "--replay", str(tmp_path / "t.jsonl")]) == 1
    assert _one_error_line(capsys) == f"Error: database file not found: {nobody}"
    assert main(["export", "--checkpoint", "~t2s-no-such-user-here/m", "--output", str(tmp_path / "x")]) == 1
    assert _one_error_line(capsys) == "Error: a path starts with ~NAME for a user this machine does not have"
    url = "postgresql://user:s3cret@[bad/t2s"
    assert main(["ask", "a question", "--db", url, "--replay", str(tmp_path / "t.jsonl")]) == 1
    line = _one_error_line(capsys)
    assert line == "Error: the PostgreSQL URL cannot be read: Invalid IPv6 URL" and "s3cret" not in line


BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(  # each level 9 times the last: 9**9 values
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
WIDE_LAUGHS = "a: &a [" + ", ".join(["x"] * 30) + "]\n" + "".join(  # 30**5 values, 6 levels deep
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 30)}]\n" for i in range(4))


@pytest.mark.parametrize("text, needle", [("a: [1, 2\n", "not valid YAML at line 2"),
                                          ("- just\n- a list\n", "must be a YAML mapping"),
                                          (BILLION_LAUGHS, "nests deeper than 8 levels"),
                                          (WIDE_LAUGHS, "expands to over 100,000 values (YAML aliases?)"),
                                          ("a: " + "[" * 50_000 + "]" * 50_000 + "\n", "nests too deeply"),
                                          ("a: " + "[1, " * 9 + "1" + "]" * 9 + "\n", "nests deeper than 8 levels"),
                                          ("learning_rate: 1.0e-5\nmax_steps: 2\nlearning_rate: 1.0\n",
                                           "at line 3 column 1: 'learning_rate' is set a second time")])
def test_malformed_recipe_yaml(tmp_path, capsys, text, needle):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    assert main(["train", "--config", str(recipe), "--output_dir", str(tmp_path / "run")]) == 2
    line = _one_error_line(capsys)
    assert needle in line and str(recipe) in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("record, needle", [
    ({"question_id": "1", "official": "yes"}, "'official' must be a number"),
    ({"question_id": "1", "official": [1]}, "'official' must be a number"),
    ({"question_id": "1", "official": 1, "sample": "first"}, "'sample' must be a whole number of 0 or more"),
    ({"question_id": "1", "official": 1, "sample": 0.5}, "'sample' must be a whole number of 0 or more"),
])
def test_wrong_types_in_a_compare_input(tmp_path, capsys, record, needle):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question_id": "1", "official": 1}) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_id": "0", "official": 0}) + "\n" + json.dumps(record) + "\n")
    assert main(["compare", str(good), str(bad)]) == 1
    line = _one_error_line(capsys)
    assert needle in line and "line 2" in line and str(bad) in line


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not valid JSON"),
    ('{"weights": 3}', "not a difficulty model"),
    ("[1, 2]", "expected a JSON object"),
])
def test_a_malformed_difficulty_model(demo_dir, tmp_path, capsys, content, needle):
    from t2s.data.difficulty import default_model, model_json

    model = tmp_path / "model.json"
    model.write_text(content)
    assert main(["data", "difficulty", "--data", str(demo_dir / "dev.json"), "--model", str(model)]) == 1
    assert needle in _one_error_line(capsys)
    broken = json.loads(model_json(default_model()))
    broken["weights"] = broken["weights"][:2]
    model.write_text(json.dumps(broken))
    assert main(["data", "difficulty", "--data", str(demo_dir / "dev.json"), "--model", str(model)]) == 1
    assert "'weights' must be 3 lists" in _one_error_line(capsys)


@pytest.mark.parametrize("key, index, value, needle", [
    ("scale", 0, 0.0, "no scale 0"),  # every question's feature divided by 0
    ("scale", 1, float("nan"), "finite numbers"),
    ("mean", 2, float("inf"), "finite numbers"),
    ("weights", None, None, "nests too deeply"),
])
def test_a_difficulty_model_with_numbers_it_cannot_use(demo_dir, tmp_path, capsys, key, index, value, needle):
    from t2s.data.difficulty import default_model, model_json

    data = json.loads(model_json(default_model()))
    model = tmp_path / "model.json"
    if index is None:
        model.write_text('{"weights": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        data[key][index] = value
        model.write_text(json.dumps(data))  # NaN and Infinity as Python's json writes (and reads) them
    assert main(["data", "difficulty", "--data", str(demo_dir / "dev.json"), "--model", str(model)]) == 1
    line = _one_error_line(capsys)
    assert "is not a difficulty model" in line and needle in line


def test_export_of_an_empty_checkpoint(tmp_path, capsys):
    empty = tmp_path / "checkpoint-100"
    empty.mkdir()
    assert main(["export", "--checkpoint", str(empty), "--output", str(tmp_path / "export")]) == 1
    assert "holds no model" in _one_error_line(capsys)
    assert not (tmp_path / "export").exists()


def test_bench_env_on_a_file_that_is_not_a_database(tmp_path, capsys):
    folder = tmp_path / "bird"
    (folder / "dev_databases" / "fake").mkdir(parents=True)
    (folder / "dev_databases" / "fake" / "fake.sqlite").write_text("not a database\n" * 20)
    (folder / "dev.json").write_text(json.dumps([{"question_id": 1, "db_id": "fake", "question": "q",
                                                  "SQL": "SELECT 1"}]))
    assert main(["bench", "env", "--data", str(folder / "dev.json"), "--workers", "1", "--repeats", "1"]) == 1
    line = _one_error_line(capsys)
    assert "fake" in line and "not a database" in line


def test_any_oserror_from_a_command_is_one_line(monkeypatch, capsys):
    import t2s.commands.compare

    def broken(args):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), "/some/where")

    monkeypatch.setattr(t2s.commands.compare, "run", broken)
    assert main(["compare", "a", "b"]) == 1
    assert _one_error_line(capsys) == "Error: Is a directory: /some/where"


def test_a_bug_keeps_its_traceback(monkeypatch):
    import t2s.commands.compare

    def buggy(args):
        raise KeyError("a bug")

    monkeypatch.setattr(t2s.commands.compare, "run", buggy)
    with pytest.raises(KeyError):
        main(["compare", "a", "b"])


def test_errors_through_the_command_line_have_no_traceback(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("x")
    done = subprocess.run([sys.executable, "-m", "t2s", "eval", "--policy", "gold", "--data", "data/demo", "--n", "2",
                           "--output", str(taken), "--quiet"], capture_output=True, text=True, timeout=300,
                          cwd=REPO_ROOT)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("Error: ") and str(taken) in done.stderr


@pytest.mark.parametrize("argv, named", [
    (["eval", "--policy", "gold", "--outptu", "OUT"], "unrecognized option --outptu; did you mean --output?"),
    (["eval", "--policy", "gold", "--output", "OUT", "--quite"], "unrecognized option --quite; did you mean --quiet?"),
    (["compare", "A", "B", "--zzz"], "unrecognized option --zzz ("),
])
def test_a_misspelt_option_is_named_with_its_closest_match(demo_dir, tmp_path, capsys, argv, named):
    """Not "--output is required": the option that was misspelt, and what it may have meant."""
    argv = [str(tmp_path / a) if a in ("OUT", "A", "B") else a for a in argv] + ["--data", str(demo_dir)] * (
        argv[0] == "eval")
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: t2s {argv[0]}: ") and named in err[0], err
    assert not (tmp_path / "OUT").exists()


def test_eval_writes_its_results_apart_from_the_data_and_its_databases(demo_dir, tmp_path, capsys):
    """An --output that is the data's own folder, or lies among the databases (where its mode folders would look like
    more databases), is one line, and nothing is written there."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(demo_dir, data)
    before = sorted(str(path.relative_to(data)) for path in data.rglob("*"))
    for output, where in ((data, f"the data's own folder {data}"),
                          (data / "dev_databases", f"inside the databases' folder {data / 'dev_databases'}"),
                          (data / "dev_databases" / "x", f"inside the databases' folder {data / 'dev_databases'}")):
        assert main(_eval(data, output)) == 1
        assert _one_error_line(capsys) == f"Error: --output {output} is {where}; write the results to another folder"
    assert sorted(str(path.relative_to(data)) for path in data.rglob("*")) == before
    assert main(_eval(data, data / "runs" / "one")) == 0  # a folder of its own below the data's is fine


def test_score_never_writes_over_what_it_reads(demo_dir, tmp_path, capsys):
    """score's --output follows eval's rule (apart from the data and its databases), and none of the files it writes
    may be the predictions file it reads: each case is one line, and every file is left as it was."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(demo_dir, data)
    rows = json.loads((data / "dev.json").read_text())[:3]
    runs = tmp_path / "runs"
    runs.mkdir()
    predictions = runs / "scores.jsonl"  # named as score's own output file
    predictions.write_text("".join(json.dumps({"question_id": r["question_id"], "sql": r["SQL"]}) + "\n"
                                   for r in rows))
    before = {path: path.read_bytes() for path in [*data.rglob("*.json"), predictions]}
    cases = ((runs, f"Error: --output {runs} would write scores.jsonl over {predictions}, which this run reads; "
                    "write the results to another folder"),
             (data, f"Error: --output {data} is the data's own folder {data}; write the results to another folder"))
    for output, line in cases:
        assert main(["score", "--data", str(data), "--predictions", str(predictions), "--output", str(output),
                     "--quiet"]) == 1
        assert _one_error_line(capsys) == line
    assert {path: path.read_bytes() for path in before} == before
    assert not (runs / "summary.json").exists() and not (data / "summary.json").exists()
    assert main(["score", "--data", str(data), "--predictions", str(predictions), "--output", str(runs / "s"),
                 "--quiet"]) == 0
