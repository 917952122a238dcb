() => {
  // What a reader would find cut off or broken on this page: one entry per offending element.
  const article = document.querySelector('article.bd-article') || document.querySelector('main');
  const col = article.getBoundingClientRect();
  const over = (el) => el.scrollWidth > el.clientWidth + 1;
  const wide = (el) => el.getBoundingClientRect().right > col.right + 1;
  const label = (el) => (el.closest('[id]') || {}).id || el.tagName;
  const out = {column: Math.round(col.width), code: [], outputs: [], math: [], images: [], tex: [], page: []};
  // the page itself must not scroll sideways (a wide table or block anywhere in the article)
  if (document.documentElement.scrollWidth > window.innerWidth + 1) out.page.push('page ' + document.documentElement.scrollWidth);
  article.querySelectorAll('table').forEach(el => { if (wide(el)) out.page.push('table ' + Math.round(el.getBoundingClientRect().width)); });
  document.querySelectorAll('div.cell_input pre').forEach(el => { if (over(el) || wide(el)) out.code.push(label(el)); });
  document.querySelectorAll('div.cell_output pre, div.output pre').forEach(el => { if (over(el) || wide(el)) out.outputs.push(label(el)); });
  document.querySelectorAll('mjx-container[display="true"]').forEach(el => {
    const box = el.getBoundingClientRect(), inner = el.firstElementChild ? el.firstElementChild.getBoundingClientRect() : box;
    if (inner.width > col.width + 1 || wide(el) || over(el)) out.math.push(Math.round(inner.width));
  });
  document.querySelectorAll('article img').forEach(el => {
    if (!el.complete || el.naturalWidth === 0) out.images.push('broken ' + el.getAttribute('src'));
    else if (wide(el)) out.images.push('wide ' + el.getAttribute('src'));
  });
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement.closest('pre, code, mjx-container, script, .highlight')) continue;
    if (/\$\$|\\\(|\\\[|\\frac|\\begin\{|\\mathbb|\\sum_/.test(n.textContent)) out.tex.push(n.textContent.trim().slice(0, 60));
  }
  return out;
}
