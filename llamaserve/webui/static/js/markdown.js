// Markdown for model output: marked (GFM) + highlight.js for code + KaTeX for $…$, $$…$$,
// \(…\) and \[…\]. Raw HTML in the text is shown as text, never injected, and only http(s),
// mailto and relative links are kept: model output is untrusted.

import { Marked } from "../vendor/marked/marked.esm.js";
import hljs from "../vendor/highlight/highlight.min.js";

const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ESC[c]);
}

function renderMath(tex, display) {
  const katex = globalThis.katex;
  if (!katex) {
    return display
      ? `<pre class="math-fallback">${escapeHtml(tex)}</pre>`
      : `<code class="math-fallback">${escapeHtml(tex)}</code>`;
  }
  try {
    return katex.renderToString(tex, {
      displayMode: display,
      throwOnError: false,
      output: "htmlAndMathml",
      strict: "ignore",
      trust: false,
      maxExpand: 500,
    });
  } catch {
    return `<code class="math-fallback">${escapeHtml(tex)}</code>`;
  }
}

const blockMath = {
  name: "blockMath",
  level: "block",
  start(src) {
    const m = src.match(/(?:^|\n)[ \t]*(\$\$|\\\[)/);
    return m ? m.index + m[0].length - m[1].length : undefined;
  },
  tokenizer(src) {
    const m = src.match(/^[ \t]*\$\$([\s\S]+?)\$\$[ \t]*(?:\n+|$)/) || src.match(/^[ \t]*\\\[([\s\S]+?)\\\][ \t]*(?:\n+|$)/);
    if (m) return { type: "blockMath", raw: m[0], text: m[1].trim() };
    return undefined;
  },
  renderer(token) {
    return `<div class="math-block">${renderMath(token.text, true)}</div>\n`;
  },
};

const inlineMath = {
  name: "inlineMath",
  level: "inline",
  start(src) {
    const m = src.match(/\$|\\\(|\\\[/);
    return m ? m.index : undefined;
  },
  tokenizer(src) {
    let m = src.match(/^\$\$([^$]+?)\$\$/);
    if (m) return { type: "inlineMath", raw: m[0], text: m[1].trim(), display: true };
    m = src.match(/^\\\[([\s\S]+?)\\\]/);
    if (m) return { type: "inlineMath", raw: m[0], text: m[1].trim(), display: true };
    m = src.match(/^\\\(([\s\S]+?)\\\)/);
    if (m) return { type: "inlineMath", raw: m[0], text: m[1].trim(), display: false };
    // $x$: no space just inside the dollars, no digit right after the closing one ("$5 and $10")
    m = src.match(/^\$(?![\s$])((?:\\.|[^\\$\n])+?)(?<![\s\\])\$(?![\d$])/);
    if (m) return { type: "inlineMath", raw: m[0], text: m[1], display: false };
    return undefined;
  },
  renderer(token) {
    return renderMath(token.text, token.display);
  },
};

function safeHref(href) {
  const h = String(href || "").trim();
  if (/^(https?:|mailto:)/i.test(h)) return h;
  if (/^[a-z][a-z0-9+.-]*:/i.test(h)) return null;  // javascript:, data:, vbscript:, …
  return h || null;
}

function highlight(code, lang) {
  const name = (lang || "").trim().split(/\s+/)[0].toLowerCase();
  try {
    if (name && hljs.getLanguage(name)) {
      return { html: hljs.highlight(code, { language: name, ignoreIllegals: true }).value, label: name };
    }
    if (!name && code.length < 4000) {
      const auto = hljs.highlightAuto(code);
      if (auto.language && auto.relevance >= 5) return { html: auto.value, label: auto.language };
    }
  } catch { /* fall through to plain text */ }
  return { html: escapeHtml(code), label: name || "text" };
}

const renderer = {
  html({ text }) {
    return escapeHtml(text);
  },
  code({ text, lang }) {
    const { html, label } = highlight(text.replace(/\n$/, ""), lang);
    return `<div class="code-block"><div class="code-head"><span class="code-lang">${escapeHtml(label)}</span>` +
      `<button type="button" class="code-copy" data-action="copy-code" aria-label="Copy ${escapeHtml(label)} code">Copy</button></div>` +
      `<pre tabindex="0"><code class="hljs language-${escapeHtml(label)}">${html}</code></pre></div>\n`;
  },
  link({ href, title, tokens }) {
    const text = this.parser.parseInline(tokens);
    const safe = safeHref(href);
    if (!safe) return text;
    const t = title ? ` title="${escapeHtml(title)}"` : "";
    return `<a href="${escapeHtml(safe)}"${t} target="_blank" rel="noopener noreferrer nofollow">${text}</a>`;
  },
  image({ href, title, text }) {
    // Never fetch images named by model output; show a link the user can choose to open.
    const safe = safeHref(href);
    const label = escapeHtml(text || title || "image");
    if (!safe) return label;
    return `<a class="md-image" href="${escapeHtml(safe)}" target="_blank" rel="noopener noreferrer nofollow">[image: ${label}]</a>`;
  },
};

const md = new Marked({
  gfm: true,
  breaks: false,
  async: false,
  extensions: [blockMath, inlineMath],
  renderer,
  hooks: {
    postprocess(html) {
      return html.replace(/<table>/g, '<div class="table-wrap" tabindex="0"><table>').replace(/<\/table>/g, "</table></div>");
    },
  },
});

export function renderMarkdown(text) {
  if (!text) return "";
  try {
    return md.parse(text);
  } catch (err) {
    console.error("markdown", err);
    return `<p>${escapeHtml(text).replace(/\n/g, "<br>")}</p>`;
  }
}

/**
 * Some chat templates leave the reasoning inline as <think>…</think> at the start of the
 * content. Splits it off: returns {reasoning, content, open} (open: </think> not seen yet).
 */
export function splitThink(content) {
  const m = content.match(/^\s*<think>([\s\S]*?)(<\/think>|$)/);
  if (!m) return { reasoning: "", content, open: false };
  return { reasoning: m[1].trim(), content: content.slice(m[0].length).replace(/^\s+/, ""), open: !m[2] };
}
