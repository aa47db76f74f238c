import {
  connectSnippet,
  formatAge,
  formatEngines,
  formatErrors,
  formatGpus,
  formatPercent,
  formatPools,
  formatProgress,
  formatReady,
  progressPercent,
  readableError,
  UNKNOWN
} from '../format';

describe('formatPercent', () => {
  it('rounds to a whole percent', () => {
    expect(formatPercent(12.4)).toBe('12%');
    expect(formatPercent(12.5)).toBe('13%');
    expect(formatPercent(0)).toBe('0%');
    expect(formatPercent(100)).toBe('100%');
  });

  it('shows a dash for an unknown value', () => {
    expect(formatPercent(null)).toBe(UNKNOWN);
    expect(formatPercent(undefined)).toBe(UNKNOWN);
    expect(formatPercent(Number.NaN)).toBe(UNKNOWN);
  });
});

describe('formatAge', () => {
  it('says seconds, minutes, hours and days', () => {
    expect(formatAge(0)).toBe('0 s');
    expect(formatAge(12.5)).toBe('12 s');
    expect(formatAge(59.9)).toBe('59 s');
    expect(formatAge(60)).toBe('1 min');
    expect(formatAge(5 * 60 + 59)).toBe('5 min');
    expect(formatAge(3600)).toBe('1 h 00 min');
    expect(formatAge(2 * 3600 + 5 * 60)).toBe('2 h 05 min');
    expect(formatAge(24 * 3600)).toBe('1 d 0 h');
    expect(formatAge(3 * 86400 + 4 * 3600 + 59)).toBe('3 d 4 h');
  });

  it('shows a dash for an unknown or negative age', () => {
    expect(formatAge(null)).toBe(UNKNOWN);
    expect(formatAge(undefined)).toBe(UNKNOWN);
    expect(formatAge(-1)).toBe(UNKNOWN);
  });
});

describe('run progress', () => {
  it('is done/total, and how full the bar is', () => {
    expect(formatProgress(37, 200)).toBe('37/200');
    expect(progressPercent(37, 200)).toBe(19);
    expect(progressPercent(0, 200)).toBe(0);
    expect(progressPercent(200, 200)).toBe(100);
  });

  it('keeps the bar between empty and full', () => {
    expect(progressPercent(-3, 10)).toBe(0);
    expect(progressPercent(12, 10)).toBe(100);
    expect(progressPercent(null, 10)).toBe(0);
    expect(progressPercent(0, 0)).toBe(100); // a run of no items has nothing left
  });

  it('counts errors, and says nothing of none', () => {
    expect(formatErrors(0)).toBe('');
    expect(formatErrors(undefined)).toBe('');
    expect(formatErrors(1)).toBe('1 error');
    expect(formatErrors(3)).toBe('3 errors');
  });
});

describe('formatReady', () => {
  it('is ready/target', () => {
    expect(formatReady(4, 4)).toBe('4/4');
    expect(formatReady(0, 32)).toBe('0/32');
  });

  it('reads a missing count as 0', () => {
    expect(formatReady(null, 4)).toBe('0/4');
    expect(formatReady(3, undefined)).toBe('3/0');
  });
});

describe('formatGpus', () => {
  it('says when there is none', () => {
    expect(formatGpus([])).toBe('no GPU');
  });

  it('gives utilisation and memory per GPU', () => {
    expect(formatGpus([{ util_percent: 3, mem_percent: 10 }])).toBe('3% (mem 10%)');
    expect(
      formatGpus([
        { util_percent: 3, mem_percent: 10 },
        { util_percent: 97.6, mem_percent: null }
      ])
    ).toBe(`3% (mem 10%), 98% (mem ${UNKNOWN})`);
  });
});

describe('formatEngines and formatPools', () => {
  it('counts engines', () => {
    expect(formatEngines(0)).toBe('0 engines');
    expect(formatEngines(1)).toBe('1 engine');
    expect(formatEngines(32)).toBe('32 engines');
    expect(formatEngines(null)).toBe('0 engines');
  });

  it('lists pools', () => {
    expect(formatPools(['gpu', 'nlp'])).toBe('gpu, nlp');
    expect(formatPools([])).toBe(UNKNOWN);
  });
});

describe('connectSnippet', () => {
  it("is the server's connect_code when there is one", () => {
    const code =
      'from jupyter_lounge import Lounge\nlounge = Lounge.attach("lounge-1")\nclient = lounge.client';
    expect(connectSnippet({ name: 'lounge-1', connect_code: code })).toBe(code);
  });

  it('is written here when the server sent none, the name quoted safely', () => {
    expect(connectSnippet({ name: 'sweep' })).toBe(
      'from jupyter_lounge import Lounge\nlounge = Lounge.attach("sweep")\nclient = lounge.client'
    );
    expect(connectSnippet({ name: 'a"b', connect_code: '  ' })).toContain(
      'Lounge.attach("a\\"b")'
    );
  });
});

describe('readableError', () => {
  it("shows the server's one-sentence message as it is", () => {
    const body = JSON.stringify({
      message: "No cluster named 'x': lounge list shows the clusters there are."
    });
    expect(readableError(404, 'Not Found', body)).toBe(
      "No cluster named 'x': lounge list shows the clusters there are."
    );
    expect(
      readableError(400, 'Bad Request', '{"message": " n must be a positive whole number. "}')
    ).toBe('n must be a positive whole number.');
  });

  it("falls back to tornado's reason", () => {
    expect(readableError(500, 'Internal Server Error', '{"reason": "boom"}')).toBe('boom');
  });

  it('explains a 403 and a 404 without a message', () => {
    expect(readableError(403, 'Forbidden', '')).toMatch(/refused the request \(403 Forbidden\)/);
    expect(
      readableError(404, 'Not Found', '<html><title>404: Not Found</title></html>')
    ).toMatch(/jupyter_lounge server extension enabled/);
  });

  it('quotes a short plain-text body, never an HTML page', () => {
    expect(readableError(502, 'Bad Gateway', 'upstream closed')).toBe(
      'The Jupyter server answered 502 Bad Gateway: upstream closed'
    );
    expect(readableError(500, '', '<!DOCTYPE html><p>oops</p>')).toBe(
      'The Jupyter server answered 500.'
    );
    expect(readableError(500, 'Internal Server Error', 'x'.repeat(400))).toHaveLength(
      'The Jupyter server answered 500 Internal Server Error: '.length + 300
    );
  });
});
