"""plotly.js for the HTML pages: inlined once per page, compressed, so a page stays self-contained (it works offline,
nothing is fetched) at about 2 MB of library instead of plotly.min.js's 4.8 MB.

The library travels deflate-compressed and base64-encoded inside a <script type="application/octet-stream"> (never
run by the browser, and base64 holds no "<" that could end it early). A small loader decodes it with the browser's
DecompressionStream (Chrome/Edge 80, Firefox 113, Safari 16.4 and later) and runs it. Until then `Plotly.newPlot` is
a stand-in that draws once the library is there, so the charts that plotly.io.to_html(include_plotlyjs=False) writes
anywhere after the loader need no change; a browser that cannot decompress shows a line in each chart's place.
"""
from __future__ import annotations

import base64
import functools
import zlib

_LOADER = """(function () {
  var packed = document.getElementById("aligner-plotly-js").textContent;
  var ready = (async function () {
    var bytes = Uint8Array.from(atob(packed), function (c) { return c.charCodeAt(0); });
    var code = await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"))).text();
    var script = document.createElement("script");
    script.text = code;
    document.head.appendChild(script);
    return window.Plotly;
  })();
  window.Plotly = {newPlot: function (div) {
    var args = arguments;
    return ready.then(function (plotly) { return plotly.newPlot.apply(plotly, args); }, function (error) {
      var where = typeof div === "string" ? document.getElementById(div) : div;
      if (where) {
        where.textContent = "This chart needs a browser that can decompress the plotly.js inlined in this page " +
          "(DecompressionStream: Chrome/Edge 80, Firefox 113, Safari 16.4 or later): " + error;
      }
    });
  }};
})();"""


@functools.lru_cache(maxsize=1)
def plotly_loader() -> str:
    """The two <script> elements that carry plotly.js and run it: written once per page, before its first chart."""
    from plotly.offline import get_plotlyjs  # lazily: only --html needs plotly

    packed = base64.b64encode(zlib.compress(get_plotlyjs().encode("utf-8"), 9)).decode("ascii")
    return (f'<script type="application/octet-stream" id="aligner-plotly-js">{packed}</script>\n'
            f"<script>{_LOADER}</script>\n")
