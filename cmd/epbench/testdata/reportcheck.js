// reportcheck.js checks an epbench report (index.html) as the browser drew
// it, and returns {problems, charts, tables, texts}. The report says what it
// holds: <main data-charts data-tables>, and per chart a <figure
// class="chart" data-chart data-labels> with one <svg>.
(() => {
  const problems = [];
  const main = document.querySelector('main[data-charts]');
  if (!main) {
    return {problems: ['no <main data-charts>: not an epbench report'], charts: 0, tables: 0, texts: 0};
  }
  const wantCharts = Number(main.dataset.charts);
  const wantTables = Number(main.dataset.tables);
  // A label's box may pass the chart's edge or another label's by a pixel
  // of antialiasing, not more.
  const inside = (a, b) => a.left >= b.left - 1 && a.right <= b.right + 1 && a.top >= b.top - 1 && a.bottom <= b.bottom + 1;
  const overlap = (a, b) =>
    Math.max(0, Math.min(a.right, b.right) - Math.max(a.left, b.left) - 1) *
    Math.max(0, Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) - 1);

  const figures = [...document.querySelectorAll('figure.chart')];
  if (figures.length !== wantCharts) {
    problems.push(`the report lists ${wantCharts} charts, the page shows ${figures.length}`);
  }
  let checked = 0;
  for (const f of figures) {
    const name = f.dataset.chart || '(unnamed chart)';
    const svgs = f.querySelectorAll(':scope > svg');
    if (svgs.length !== 1) {
      problems.push(`${name}: ${svgs.length} <svg> elements, want 1`);
      continue;
    }
    const svg = svgs[0];
    const box = svg.getBoundingClientRect();
    if (box.width < 300 || box.height < 150) {
      problems.push(`${name}: drawn ${Math.round(box.width)}×${Math.round(box.height)} px`);
    }
    const paths = svg.querySelectorAll('path').length;
    if (paths < 5) {
      problems.push(`${name}: ${paths} paths, no data drawn`);
    }
    const texts = [...svg.querySelectorAll('text')].filter((t) => t.textContent.trim() !== '');
    const words = texts.map((t) => t.textContent.trim());
    const rects = texts.map((t) => t.getBoundingClientRect());
    let want = [];
    try {
      want = JSON.parse(f.dataset.labels || '[]');
    } catch (e) {
      problems.push(`${name}: data-labels is not JSON`);
    }
    if (want.length === 0) {
      problems.push(`${name}: no labels to look for`);
    }
    for (const w of want) {
      const i = words.indexOf(w);
      if (i < 0) {
        problems.push(`${name}: label "${w}" not rendered`);
      }
    }
    texts.forEach((t, i) => {
      const r = rects[i];
      checked++;
      if (r.width === 0 || r.height === 0) {
        problems.push(`${name}: "${words[i]}" not rendered (no size)`);
        return;
      }
      if (!inside(r, box)) {
        problems.push(`${name}: "${words[i]}" clipped by the chart's edge`);
      }
      for (let j = 0; j < i; j++) {
        const o = overlap(r, rects[j]);
        if (o > 0.1 * Math.min(r.width * r.height, rects[j].width * rects[j].height)) {
          problems.push(`${name}: "${words[i]}" overlaps "${words[j]}"`);
        }
      }
    });
  }

  const tables = [...document.querySelectorAll('table')];
  if (tables.length !== wantTables) {
    problems.push(`the report lists ${wantTables} tables, the page shows ${tables.length}`);
  }
  tables.forEach((t, i) => {
    const r = t.getBoundingClientRect();
    const rows = t.querySelectorAll('tbody tr');
    const head = t.querySelectorAll('thead th').length;
    const name = t.closest('section') ? `${t.closest('section').id} table ${i}` : `table ${i}`;
    if (rows.length === 0 || head === 0) {
      problems.push(`${name}: ${head} columns, ${rows.length} rows`);
    }
    if (r.width < 100 || r.height < 20) {
      problems.push(`${name}: drawn ${Math.round(r.width)}×${Math.round(r.height)} px`);
    }
    rows.forEach((row, k) => {
      if (row.cells.length !== head) {
        problems.push(`${name}: row ${k} has ${row.cells.length} cells for ${head} columns`);
      }
    });
  });
  if (!document.querySelector('pre.command') || document.querySelector('pre.command').textContent.trim() === '') {
    problems.push('no command at the top');
  }
  if (document.querySelectorAll('dl.machine dt').length < 3) {
    problems.push('no machine description at the top');
  }
  return {problems, charts: figures.length, tables: tables.length, texts: checked};
})()
