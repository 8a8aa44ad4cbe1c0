// Runs report.html's script in node against a small stand-in for the DOM (for machines without a browser):
// node report_page_dom.js PAGE.html HASH  ->  prints JSON {status: {...}, detail: {...}, rows: [...]}
const fs = require('fs');
const page = fs.readFileSync(process.argv[2], 'utf8');
const hash = process.argv[3] || '';
const data = page.match(/<script type="application\/json" id="data">([\s\S]*?)<\/script>/)[1];
const script = page.match(/<script>([\s\S]*?)<\/script>\s*<\/body>/)[1];

class Node {
  constructor(tag) { this.tag = tag; this.children = []; this.attrs = {}; this.listeners = {}; this._text = '';
    this.className = ''; this.hidden = false; this.value = ''; this.checked = false; this.scrollTop = 0; }
  appendChild(c) { this.children.push(c); return c; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  getAttribute(k) { return k in this.attrs ? this.attrs[k] : null; }
  removeAttribute(k) { delete this.attrs[k]; }
  addEventListener(t, f) { (this.listeners[t] = this.listeners[t] || []).push(f); }
  set textContent(t) { this.children = []; this._text = String(t); }
  get textContent() { return this._text + this.children.map(c => c.textContent).join(''); }
  querySelector(sel) { return this.children.find(c => c.tag === sel) || null; }
  getBoundingClientRect() { return { top: 0 }; }
}
const byId = {};
const tbody = new Node('tbody');
const document = {
  getElementById(id) { if (!byId[id]) { byId[id] = new Node('div'); if (id === 'data') byId[id]._text = data; if (id === 'detail') byId[id].hidden = true; } return byId[id]; },
  querySelector(sel) { if (sel === '#episodes tbody') return tbody; throw new Error('unexpected selector ' + sel); },
  querySelectorAll(sel) { if (sel === '#episodes thead th') return []; throw new Error('unexpected selector ' + sel); },
  createElement(tag) { return new Node(tag); },
  createTextNode(text) { const n = new Node('#text'); n._text = String(text); return n; },
};
const window = { scrollY: 0, addEventListener() {} };
const location = { hash };
const errors = [];
const consoleStub = { error: (...a) => errors.push(a.join(' ')) };
new Function('document', 'window', 'location', 'console', script)(document, window, location, consoleStub);
const rows = tbody.children.map(tr => ({ cls: tr.className, cells: tr.children.map(td => td.textContent),
  marks: tr.children.flatMap(td => td.children.filter(c => c.tag === 'span').map(c => c.className)) }));
const detail = document.getElementById('detail');
console.log(JSON.stringify({ status: document.getElementById('status').attrs,
  detail: { ...detail.attrs, hidden: detail.hidden, text: detail.textContent }, rows, errors }));
