// debugpagecheck.js checks the debug page (package observe/debugpage) as the
// browser drew it, and returns {problems, rows}: rows counts the peer rows
// of each state the test expects (window.wantStates), each drawn, with its
// state's coloured badge; the totals and the latency table drawn; nothing
// wider than the window.
(() => {
  const problems = [];
  const rows = {};
  const drawn = (el) => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  };
  for (const state of window.wantStates) {
    const trs = [...document.querySelectorAll(`tr.peer.${state}`)];
    rows[state] = trs.length;
    if (trs.length === 0) {
      problems.push(`no ${state} row`);
    }
    for (const tr of trs) {
      if (!drawn(tr)) {
        problems.push(`a ${state} row is not drawn`);
      }
      const badge = tr.querySelector(`.badge.${state}`);
      if (!badge || !drawn(badge)) {
        problems.push(`a ${state} row has no badge`);
      } else if (getComputedStyle(badge).backgroundColor === 'rgba(0, 0, 0, 0)') {
        problems.push(`the ${state} badge has no colour`);
      }
    }
  }
  for (const [sel, what] of [['dl.figures', 'the totals'], ['table.latency', 'the latency table'], ['p.showing', 'the count of peers shown']]) {
    const el = document.querySelector(sel);
    if (!el || !drawn(el)) {
      problems.push(`${what} (${sel}) not drawn`);
    }
  }
  const failed = document.querySelector('tr.peer.failed');
  if (failed && !failed.textContent.includes(window.wantError)) {
    problems.push(`the failed row does not show its error: ${failed.textContent}`);
  }
  if (document.documentElement.scrollWidth > window.innerWidth + 1) {
    problems.push(`the page is ${document.documentElement.scrollWidth}px wide, the window ${window.innerWidth}px`);
  }
  return {problems, rows};
})()
