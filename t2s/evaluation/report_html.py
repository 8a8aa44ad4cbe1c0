"""``report.html``: a self-contained page of an eval folder (or of the questions two runs disagree on).

No network and no external script or style: the data is a JSON block inside the page, read by inline JavaScript.
The page holds the summary table, the plot (summary.png, embedded), accuracy per difficulty and per database, and a
filterable list of episodes; an episode opens into its transcript (thinking folded, tool calls, observations,
formatted SQL) with the gold and predicted rows side by side. With k samples per question the page holds each
question's first sample in full, with every sample's scores and the question's vote (``votes.jsonl``) beside it, so
that its size grows with the number of questions, not with k.

The first screen holds the summary table, the plot and the list of episodes (in data order: mode by mode, then
question id, then sample); the tables per difficulty and per database follow the list.

The URL hash (``HASH_PARAMETERS``, also listed on the page) sets the filters and opens an episode:
``#id=QUESTION_ID`` opens that question (the id ``show --id`` takes; with ``mode=M`` or ``sample=S``, that mode's or
sample's episode), ``mode=M``, ``db=DB``, ``difficulty=D``, ``wrong=1`` and ``q=TEXT`` filter the list, and
``open=N`` opens the N-th episode of the list as written in the page (from 0), whatever its id. Parameters join with
``&``: ``#mode=full&id=42``. The page writes what it shows into ``#status`` (``data-shown``, ``data-total``,
``data-errors``, ``data-missing`` for an id it does not hold, ``data-first-row-top``: where the list's first row
starts, ``data-columns`` and ``data-columns-aligned``: the header's cells, and how many of the first row's cells start
where their header cell does), and the open episode into ``#detail`` (``data-open``, ``data-question-id``), so a headless browser can check
it; and its own clock: ``data-list-ms`` (from navigation start until the episode list is laid out) and
``data-open-ms`` (the last transcript opened), which ``bench report`` reads. Each episode's turns and row previews
are a JSON string of their own (``data.details``), parsed when the episode opens, so that the list does not wait for
them.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path

from t2s.errors import writing

PAGE_TITLE = "t2s eval report"
# (parameter, what it does): the URL hash the page reads, shown on the page and in docs/evaluation.md
HASH_PARAMETERS = (
    ("id=QUESTION_ID", "open that question (the id show --id takes)"),
    ("mode=M", "list mode M only (with id: open that mode's episode)"),
    ("sample=S", "with id: open sample S (with k samples the page holds each question's first sample in full and "
                 "every sample's scores: the question opens on its first sample)"),
    ("db=DB", "list database DB only"),
    ("difficulty=D", "list difficulty D only"),
    ("wrong=1", "list the wrong answers only"),
    ("q=TEXT", "list the episodes whose question, SQL or id holds TEXT"),
    ("open=N", "open the N-th episode of the page's list, from 0 (a position, not an id)"),
)


def _sql(sql) -> str:
    from t2s.evaluation.transcript import format_sql

    return _cached_sql(sql) if isinstance(sql, str) else format_sql(sql)


@functools.lru_cache(maxsize=65_536)
def _cached_sql(sql: str) -> str:
    """sqlparse is slow (milliseconds a statement), and an episode repeats its SQL: the submitted one, the gold one."""
    from t2s.evaluation.transcript import format_sql

    return format_sql(sql)


#: what only an opened transcript needs: the page keeps it per episode as a JSON string, parsed when it opens
DETAIL_KEYS = ("turns", "gold_result", "pred_result")


def _split_details(episodes: list[dict]) -> list[str]:
    """Move each episode's DETAIL_KEYS into a JSON string of its own (``data.details[i]``)."""
    details = []
    for line in episodes:
        details.append(json.dumps({key: line.pop(key) for key in DETAIL_KEYS if key in line}, ensure_ascii=False,
                                  default=str))
    return details


def _page_line(line: dict) -> dict:
    """An episode line as the page shows it: SQL formatted (the files keep it as written); a turn's text after its
    thinking only when it made no call (the calls show it), and no ``submitted_sql`` (the final SQL shows it)."""
    from t2s.env.turns import split_thinking

    shown = {key: value for key, value in line.items() if key != "submitted_sql"}
    turns = []
    for turn in line.get("turns") or []:
        thinking, body, _ = split_thinking(turn.get("assistant") or "")
        calls = []
        for call in turn.get("calls") or []:
            args = call.get("args")
            sql = args.get("sql") if isinstance(args, dict) and isinstance(args.get("sql"), str) else None
            rest = {k: v for k, v in args.items() if k != "sql"} if isinstance(args, dict) else args
            calls.append({"tool": call.get("tool"), "args": rest, "sql": _sql(sql) if sql else None})
        turns.append({"thinking": thinking.strip(), "body": "" if calls else body.strip(), "calls": calls,
                      "observation": turn.get("observation") or ""})
    shown["turns"] = turns
    shown["final_sql"] = _sql(line.get("final_sql"))
    shown["gold_sql"] = _sql(line.get("gold_sql"))
    return shown


def _embedded_png(path: Path) -> str | None:
    if not path.is_file():
        return None
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _shown(json_text: str) -> str:
    """JSON text whose strings read back with each character a terminal never shows raw (``console.UNSAFE``: bidi
    overrides, which would reverse the text after them on the page, C1 controls) as a visible ``\\u202e``."""
    from t2s.ui.console import UNSAFE

    return UNSAFE.sub(lambda match: f"\\\\u{ord(match.group()):04x}", json_text)


def render_page(data: dict) -> str:
    """The HTML page of ``data`` (title, summaries, plot, episodes, pairs)."""
    import html

    if isinstance(data.get("details"), list):  # JSON texts of their own: their strings are shown the same way
        data = {**data, "details": [_shown(text) if isinstance(text, str) else text for text in data["details"]]}
    # inside <script>, "</" would end the block and "<!--" would change how it ends: both written as JSON escapes
    payload = json.dumps(data, ensure_ascii=False, default=str).replace("</", "<\\/").replace("<!--", "<\\u0021--")
    payload = _shown(payload)
    from t2s.ui.console import safe_text

    title = html.escape(safe_text(data.get("title") or PAGE_TITLE))  # as text, its unsafe characters as escapes
    links = "; ".join(f"<code>{html.escape(name)}</code> {html.escape(what)}" for name, what in HASH_PARAMETERS)
    return (_TEMPLATE.replace("__TITLE__", title).replace("__STYLE__", _STYLE).replace("__SCRIPT__", _SCRIPT)
            .replace("__LINKS__", links).replace("__DATA__", payload))


SAMPLE_SCORES = ("sample", "official", "strict", "soft_f1")


def _episode_lines(path: Path, damaged: list[str]):
    """The lines of an episodes file a reader can use (``records.line_problem``), read a line at a time; each other
    line (not UTF-8, not JSON, not what eval writes, or cut off by a killed run) is left out and named in
    ``damaged``."""
    from t2s.evaluation.records import line_problem

    with open(path, "rb") as handle:  # split on b"\n" only: U+2028 and \x85 are text inside a JSON string
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                damaged.append(f"line {number}: not valid JSON")
                continue
            if problem := line_problem(line):
                damaged.append(f"line {number}: {problem}")
                continue
            yield line


def question_lines(path: Path, mode: str, votes: dict[str, dict], damaged: list[str] | None = None) -> list[dict]:
    """The page's lines of one mode's episodes file, read a line at a time: each question's first sample, with
    ``samples`` (every sample's scores) and ``vote`` added when it has more than one sample or a vote. A damaged line
    is left out and named in ``damaged``."""
    firsts: dict[str, dict] = {}
    scores: dict[str, list[dict]] = {}
    for line in _episode_lines(path, [] if damaged is None else damaged):
        key = str(line.get("question_id"))
        scores.setdefault(key, []).append({name: line.get(name) for name in SAMPLE_SCORES})
        if key not in firsts or int(line.get("sample") or 0) < int(firsts[key].get("sample") or 0):
            firsts[key] = line
    lines = []
    for key, line in firsts.items():
        line = {**line, "mode": line.get("mode") or mode}
        if len(scores[key]) > 1 or key in votes:
            line["samples"] = sorted(scores[key], key=lambda s: int(s.get("sample") or 0))
            if key in votes:
                line["vote"] = {name: votes[key].get(name) for name in ("sample", "official")}
        lines.append(_page_line(line))
    return lines


def _votes(path: Path) -> dict[str, dict]:
    """{question id: vote} of a ``votes.jsonl``; a line that is not a vote of a question is left out."""
    votes = {}
    with open(path, "rb") as handle:
        for raw in handle:
            try:
                vote = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # not UTF-8, not JSON, blank
                continue
            if isinstance(vote, dict) and "question_id" in vote:
                votes[str(vote["question_id"])] = vote
    return votes


def write_report(folder) -> Path:
    """Write ``folder/report.html`` from an eval folder's summary.json, summary.png, episodes and votes. A damaged
    episode line (a hand edit, another tool's file) is left out of the page, and the lines left out of each file are
    counted in one warning line on stderr."""
    from t2s.evaluation.browse import in_data_order
    from t2s.evaluation.run_folders import EPISODES, VOTES, read_summaries
    from t2s.ui.console import print_line

    folder = Path(folder)
    summaries = read_summaries(folder)
    lines = []
    for mode in summaries:
        path = folder / mode / EPISODES
        if path.is_file():
            votes_path = folder / mode / VOTES
            damaged: list[str] = []
            lines += question_lines(path, mode, _votes(votes_path) if votes_path.is_file() else {}, damaged)
            if damaged:
                print_line(f"Warning: report.html leaves out {len(damaged)} damaged line(s) of {path} (first: "
                           f"{damaged[0]})", stderr=True)
    episodes = in_data_order(lines)
    data = {"title": f"{PAGE_TITLE}: {folder.name}", "summaries": summaries,
            "plot": _embedded_png(folder / "summary.png"), "episodes": episodes, "details": _split_details(episodes)}
    out = folder / "report.html"
    with writing(out):
        out.write_text(render_page(data), encoding="utf-8")
    return out


def write_compare_report(path, report: dict, pairs: list[tuple[str, dict, dict]], names: tuple[str, str]) -> Path:
    """Write the page of a ``compare``: its figures and the questions that flipped, both runs side by side."""
    episodes = [{**_page_line(a), "flip": label, "other": _page_line(b)} for label, a, b in pairs]
    data = {"title": f"t2s compare: A {names[0]} / B {names[1]}", "compare": report, "episodes": episodes,
            "names": list(names)}
    path = Path(path)
    with writing(path):
        path.write_text(render_page(data), encoding="utf-8")
    return path


_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>__STYLE__</style></head>
<body>
<header><h1 id="title">__TITLE__</h1><div id="status" data-shown="0" data-total="0" data-errors=""></div></header>
<main>
<section id="summary"></section>
<section id="episodes-section"><h2>Episodes</h2>
<p id="links" class="dim">Link to a view with the address's hash, parameters joined by &amp;: __LINKS__.</p>
<div id="filters">
<input id="f-q" type="search" placeholder="search question, SQL, id">
<select id="f-mode"><option value="">every mode</option></select>
<select id="f-db"><option value="">every database</option></select>
<select id="f-difficulty"><option value="">every difficulty</option></select>
<label><input id="f-wrong" type="checkbox"> wrong only</label>
<span id="count"></span></div>
<table id="episodes"><thead><tr><th>id</th><th>mode</th><th>db</th><th>difficulty</th><th>score</th><th>turns</th>
<th>question</th></tr></thead><tbody></tbody></table>
</section>
<section id="breakdown"></section>
<section id="detail" hidden></section>
</main>
<script type="application/json" id="data">__DATA__</script>
<script>__SCRIPT__</script>
</body></html>
"""

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232b;background:#f6f7f9}
header{background:#24303f;color:#fff;padding:10px 18px}h1{font-size:18px;margin:0}
main{padding:12px 18px}h2{font-size:16px;margin:18px 0 8px}h3{font-size:14px;margin:12px 0 6px}
table{border-collapse:collapse;background:#fff;margin-bottom:10px}
td,th{border:1px solid #d5d9e0;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#eef1f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
#episodes tbody tr{cursor:pointer}#episodes tbody tr:hover{background:#eef4ff}
tr.ok td.score,span.ok{color:#18794e;font-weight:600}tr.bad td.score,span.bad{color:#c0362c;font-weight:600}
#overview{display:flex;gap:18px;align-items:flex-start;flex-wrap:wrap}#overview table td,#overview table th{padding:1px 6px}
#overview h2{margin-top:6px}#links{margin:0 0 6px}#links code{background:#eef1f5;padding:0 3px}
#breakdown{display:flex;gap:18px;flex-wrap:wrap}#breakdown>div{min-width:320px}
#filters{display:flex;gap:8px;align-items:center;margin-bottom:8px;flex-wrap:wrap}
#filters input[type=search]{width:280px;padding:3px}
#detail{position:fixed;top:0;right:0;width:58%;height:100%;overflow:auto;box-sizing:border-box;background:#fff;border-left:2px solid #8aa4c8;padding:10px 16px;box-shadow:-4px 0 12px rgba(0,0,0,.12)}
#close{float:right}
.turn{border-left:3px solid #8aa4c8;padding:4px 10px;margin:8px 0}
details.thinking summary{color:#66707c;cursor:pointer}details.thinking pre{color:#66707c}
pre{white-space:pre-wrap;word-break:break-word;margin:4px 0;font:12.5px/1.4 ui-monospace,monospace}
pre.sql{background:#f3f6fb;padding:6px;border-radius:4px}.call{color:#1f4f99}
pre.obs{background:#f2faf4;padding:6px;border-radius:4px}
.side{display:flex;gap:14px;flex-wrap:wrap}.side>div{flex:1;min-width:300px;overflow-x:auto}
.err{color:#c0362c}.dim{color:#66707c}.plot{max-width:560px;max-height:300px;display:block}
div.pair{display:flex;gap:14px}div.pair>div{flex:1;min-width:0}
"""

_SCRIPT = r"""
(function(){
var errors=[];
function note(m){errors.push(String(m));var s=document.getElementById('status');if(s)s.setAttribute('data-errors',errors.join(' | '));}
window.addEventListener('error',function(e){note(e.message);});
var origError=console.error;console.error=function(){note(Array.prototype.join.call(arguments,' '));origError.apply(console,arguments);};
var data=JSON.parse(document.getElementById('data').textContent);
var episodes=data.episodes||[];var details=data.details||[];
function full(i){var e=episodes[i];if(typeof details[i]==='string'){var more=JSON.parse(details[i]);for(var k in more)e[k]=more[k];details[i]=null;}return e;}
function el(tag,attrs,children){var n=document.createElement(tag);attrs=attrs||{};
 for(var k in attrs){if(k==='text')n.textContent=attrs[k];else if(k==='cls')n.className=attrs[k];else n.setAttribute(k,attrs[k]);}
 (children||[]).forEach(function(c){if(c!=null)n.appendChild(typeof c==='string'?document.createTextNode(c):c);});return n;}
function fmt(v,kind){if(v===null||v===undefined)return '-';if(kind==='d')return String(v);if(typeof v==='number')return v.toFixed(kind==='2'?2:3);return String(v);}
function table(head,rows,numeric){var t=el('table');var tr=el('tr');head.forEach(function(h){tr.appendChild(el('th',{text:h}));});
 t.appendChild(el('thead',{},[tr]));var tb=el('tbody');rows.forEach(function(r){var row=el('tr');
 r.forEach(function(c,i){row.appendChild(el('td',{text:c,cls:(numeric&&i>0)?'num':''}));});tb.appendChild(row);});t.appendChild(tb);return t;}
var MAIN=[['questions (n)','n','d'],['official EX','execution_accuracy_official','f'],['official EX, no fallback','execution_accuracy_official_no_fallback','f'],
 ['strict EX','strict','f'],['Soft-F1','soft_f1','f'],['vote@k official EX','vote_at_k','f'],['submit rate','submit_rate','f'],['SQL executes','executes_rate','f'],
 ['mean turns','mean_turns','2'],['mean calls','mean_calls','2'],['fallback rate','fallback_rate','f'],['forced final turn','forced_rate','f'],
 ['truncated','truncation_rate','f'],['turn cut-offs','turn_cutoff_rate','f'],['format deviations','format_deviation_rate','f'],['write attempts','write_attempts','d']];
function summary(){var box=document.getElementById('summary');
 if(data.compare){var c=data.compare;box.appendChild(el('h2',{text:'Paired comparison'}));
  box.appendChild(el('p',{text:'A: '+data.names[0]+'   B: '+data.names[1]}));
  box.appendChild(table(['figure','value'],['n','acc_a','acc_b','delta','ci_low','ci_high','mcnemar_p','only_a','only_b'].map(function(k){return [k,fmt(c[k],k==='n'||k.indexOf('only')===0?'d':'f')];}),true));
  box.appendChild(el('p',{cls:'dim',text:'The episodes below are the questions that flipped: only_a (A right, B wrong) and only_b.'}));return;}
 var s=data.summaries||{};var modes=Object.keys(s);var left=el('div',{},[el('h2',{text:'Summary'})]);
 left.appendChild(table(['metric'].concat(modes),MAIN.filter(function(m){return modes.some(function(x){return s[x][m[1]]!==undefined;});})
  .map(function(m){return [m[0]].concat(modes.map(function(x){return fmt(s[x][m[1]],m[2]);}));}),true));
 var right=el('div');
 if(data.plot){right.appendChild(el('img',{src:data.plot,cls:'plot',alt:'official EX by difficulty'}));}
 modes.forEach(function(x){var cfg=s[x].config||{};right.appendChild(el('p',{cls:'dim',text:x+': policy '+cfg.policy+', target '+(cfg.model||cfg.endpoint||cfg.predictions||cfg.policy)+', k '+cfg.k+', seed '+cfg.seed+', n '+cfg.n}));});
 box.appendChild(el('div',{id:'overview'},[left,right]));
 var per1=el('div',{},[el('h2',{text:'Per difficulty'})]),per2=el('div',{},[el('h2',{text:'Per database'})]);
 modes.forEach(function(x){var per=s[x].per_difficulty||{};per1.appendChild(el('h3',{text:x}));
  per1.appendChild(table(['difficulty','n','official EX','strict EX','Soft-F1','submit rate'],Object.keys(per).map(function(d){var b=per[d];
  return [d,fmt(b.n,'d'),fmt(b.execution_accuracy_official),fmt(b.strict),fmt(b.soft_f1),fmt(b.submit_rate)];}),true));});
 modes.forEach(function(x){var per=s[x].per_db||{};per2.appendChild(el('h3',{text:x}));
  per2.appendChild(table(['database','n','official EX','strict EX','Soft-F1'],Object.keys(per).map(function(d){var b=per[d];
  return [d,fmt(b.n,'d'),fmt(b.execution_accuracy_official),fmt(b.strict),fmt(b.soft_f1)];}),true));});
 var under=document.getElementById('breakdown');under.appendChild(per1);under.appendChild(per2);}
function options(id,key){var sel=document.getElementById(id);var seen={};episodes.forEach(function(e){var v=e[key];if(v!=null&&v!==''&&!seen[v]){seen[v]=1;}});
 Object.keys(seen).sort().forEach(function(v){sel.appendChild(el('option',{value:v,text:v}));});}
function score(e){if(e.official===null||e.official===undefined)return e.tier||'-';return String(e.official);}
function mark(e){return el('span',{text:score(e),cls:wrong(e)?'bad':'ok'});}
function wrong(e){return e.official!==null&&e.official!==undefined?!e.official:(e.tier!==undefined&&e.tier!=='equivalent');}
function hay(e){return [e.question_id,e.question,e.db_id,e.final_sql,e.gold_sql,e.evidence].join(' ').toLowerCase();}
function state(){return {q:document.getElementById('f-q').value.toLowerCase(),mode:document.getElementById('f-mode').value,
 db:document.getElementById('f-db').value,difficulty:document.getElementById('f-difficulty').value,wrong:document.getElementById('f-wrong').checked};}
function render(){var st=state();var tb=document.querySelector('#episodes tbody');tb.textContent='';var shown=0;
 episodes.forEach(function(e,i){if(st.mode&&e.mode!==st.mode)return;if(st.db&&e.db_id!==st.db)return;if(st.difficulty&&e.difficulty!==st.difficulty)return;
  if(st.wrong&&!wrong(e))return;if(st.q&&hay(e).indexOf(st.q)<0)return;shown++;
  var sampled=e.samples?' ('+e.samples.filter(function(s){return s.official===1;}).length+'/'+e.samples.length+(e.vote?', vote '+fmt(e.vote.official,'d'):'')+')':'';
  var cell=e.other?el('td',{},[e.flip+' A ',mark(e),' B ',mark(e.other)]):el('td',{text:score(e)+sampled,cls:'score'});
  var tr=el('tr',{cls:e.other?'pair':(wrong(e)?'bad':'ok'),'data-index':String(i)},[el('td',{text:String(e.question_id)+(e.sample?' #'+e.sample:'')}),el('td',{text:e.mode||''}),
   el('td',{text:e.db_id||''}),el('td',{text:e.difficulty||''}),cell,el('td',{text:String((e.counters||{}).turns||0)}),
   el('td',{text:e.question||''})]);tr.addEventListener('click',function(){open(i);});tb.appendChild(tr);});
 document.getElementById('count').textContent=shown+' of '+episodes.length+' episodes';
 var s=document.getElementById('status');s.setAttribute('data-shown',String(shown));s.setAttribute('data-total',String(episodes.length));
 var first=tb.querySelector('tr');s.setAttribute('data-first-row-top',first?String(Math.round(first.getBoundingClientRect().top+window.scrollY)):'');
 var ths=document.querySelectorAll('#episodes thead th'),aligned=0;
 for(var c=0;first&&c<ths.length&&c<first.children.length;c++){if(Math.abs(ths[c].getBoundingClientRect().left-first.children[c].getBoundingClientRect().left)<=1)aligned++;}
 s.setAttribute('data-columns',String(ths.length));s.setAttribute('data-columns-aligned',String(aligned));
 if(s.getAttribute('data-list-ms')===null){void tb.offsetHeight;s.setAttribute('data-list-ms',String(Math.round(performance.now())));}}
function rows(title,p){var box=el('div',{},[el('h3',{text:title})]);if(!p){box.appendChild(el('p',{cls:'dim',text:'not run'}));return box;}
 if(p.error){box.appendChild(el('p',{cls:'err',text:p.error}));return box;}
 box.appendChild(table(p.columns&&p.columns.length?p.columns:['(no columns)'],(p.rows||[]).map(function(r){return r.map(function(v){return v===null?'NULL':String(v);});}),false));
 if(p.more)box.appendChild(el('p',{cls:'dim',text:'more rows not shown'}));return box;}
function transcript(e){var box=el('div');
 box.appendChild(el('h2',{text:'Question '+e.question_id+(e.sample?' (sample '+e.sample+')':'')+' on '+e.db_id+(e.mode?' ('+e.mode+')':'')}));
 if(e.question)box.appendChild(el('p',{text:e.question}));if(e.evidence)box.appendChild(el('p',{cls:'dim',text:'evidence: '+e.evidence}));
 (e.turns||[]).forEach(function(t,n){var d=el('div',{cls:'turn'},[el('h3',{text:'turn '+(n+1)})]);
  if(t.thinking){d.appendChild(el('details',{cls:'thinking'},[el('summary',{text:'thinking ('+t.thinking.length+' characters)'}),el('pre',{text:t.thinking})]));}
  if(t.calls&&t.calls.length){t.calls.forEach(function(c){var args=c.args&&Object.keys(c.args).length?' '+JSON.stringify(c.args):'';
   d.appendChild(el('pre',{cls:'call',text:c.tool+args}));if(c.sql)d.appendChild(el('pre',{cls:'sql',text:c.sql}));});}
  else if(t.body){d.appendChild(el('pre',{text:t.body}));}
  if(t.observation)d.appendChild(el('pre',{cls:'obs',text:t.observation}));box.appendChild(d);});
 box.appendChild(el('h3',{text:'final SQL ('+(e.final_sql_source||'none')+')'}));box.appendChild(el('pre',{cls:'sql',text:e.final_sql||'none'}));
 if(e.gold_sql){box.appendChild(el('h3',{text:'gold SQL'}));box.appendChild(el('pre',{cls:'sql',text:e.gold_sql}));}
 var sc=['official','strict','soft_f1','reward','tier','f1','join','consensus'].filter(function(k){return e[k]!==undefined&&e[k]!==null;}).map(function(k){return k+'='+e[k];});
 box.appendChild(el('p',{text:sc.join('  ')}));
 if(e.samples){box.appendChild(el('p',{cls:'samples',text:e.samples.length+' samples, official EX of each: '+e.samples.map(function(s){return '#'+s.sample+' '+fmt(s.official,'d');}).join(', ')
  +(e.vote?'; vote: sample '+fmt(e.vote.sample,'d')+', official '+fmt(e.vote.official,'d'):'')+' (the transcript is sample '+(e.sample||0)+')'}));}box.appendChild(el('p',{cls:'dim',text:Object.keys(e.counters||{}).map(function(k){return k+'='+e.counters[k];}).join(' ')}));
 if(e.error)box.appendChild(el('p',{cls:'err',text:e.error}));
 box.appendChild(el('div',{cls:'side'},[rows('gold rows',e.gold_result),rows('predicted rows',e.pred_result)]));return box;}
function open(i){var t0=performance.now();var e=full(i);var d=document.getElementById('detail');d.textContent='';d.hidden=false;d.setAttribute('data-question-id',String(e.question_id));
 var x=el('button',{id:'close',text:'close'});x.addEventListener('click',function(){d.hidden=true;});d.appendChild(x);
 if(e.other){d.appendChild(el('div',{cls:'pair'},[el('div',{},[el('h2',{text:'A: '+data.names[0]}),transcript(e)]),el('div',{},[el('h2',{text:'B: '+data.names[1]}),transcript(e.other)])]));}
 else d.appendChild(transcript(e));d.setAttribute('data-open',String(i));d.scrollTop=0;
 void d.offsetHeight;document.getElementById('status').setAttribute('data-open-ms',String(Math.round(performance.now()-t0)));}
function fromHash(){var h=(location.hash||'').replace(/^#/,'');var params={};h.split('&').forEach(function(p){if(!p)return;var kv=p.split('=');params[decodeURIComponent(kv[0])]=decodeURIComponent(kv.slice(1).join('='));});
 if(params.q)document.getElementById('f-q').value=params.q;if(params.mode)document.getElementById('f-mode').value=params.mode;
 if(params.db)document.getElementById('f-db').value=params.db;if(params.difficulty)document.getElementById('f-difficulty').value=params.difficulty;
 if(params.wrong)document.getElementById('f-wrong').checked=params.wrong!=='0';render();
 var st=document.getElementById('status');st.removeAttribute('data-missing');
 if(params.id!==undefined){var at=find(params);if(at>=0)open(at);else{st.setAttribute('data-missing',params.id);
  document.getElementById('count').textContent+=' (no episode of question '+params.id+(params.mode?' in mode '+params.mode:'')+')';}}
 else if(params.open!==undefined&&episodes[Number(params.open)])open(Number(params.open));}
function find(p){for(var i=0;i<episodes.length;i++){var e=episodes[i];if(String(e.question_id)!==p.id)continue;
 if(p.mode&&e.mode!==p.mode)continue;if(p.sample!==undefined&&String(e.sample||0)!==p.sample
  &&!(e.samples||[]).some(function(s){return String(s.sample)===p.sample;}))continue;return i;}return -1;}
summary();options('f-mode','mode');options('f-db','db_id');options('f-difficulty','difficulty');
['f-q','f-mode','f-db','f-difficulty','f-wrong'].forEach(function(id){var n=document.getElementById(id);n.addEventListener('input',render);n.addEventListener('change',render);});
window.addEventListener('hashchange',fromHash);fromHash();
document.getElementById('status').setAttribute('data-ready','1');
})();
"""
