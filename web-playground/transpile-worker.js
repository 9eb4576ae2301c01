// Transpiles a policy component the user picked, in the browser, with the same
// jco (js-component-bindgen, bundled by build.sh into transpiler/) that
// build.sh runs on the example policies. In a worker: a large component takes
// a while, and the page stays responsive meanwhile. jco only reads the
// component here; none of the policy's code runs.
//   {id, bytes} -> {id, js, cores: {file: bytes}} | {id, fail}
import { $init, generate } from './transpiler/transpiler.js';
import { TRANSPILE_OPTIONS, pickFiles } from './lib/transpile-output.js';

self.onmessage = async ({ data }) => {
  try {
    await $init;
    const out = generate(new Uint8Array(data.bytes), TRANSPILE_OPTIONS);
    const picked = pickFiles(out);
    self.postMessage({ id: data.id, ...picked });
  } catch (e) {
    // jco reports a bad component as a ComponentError whose payload is the text.
    const why = e && e.payload !== undefined ? String(e.payload) : String(e && e.message ? e.message : e);
    self.postMessage({ id: data.id, fail: `cannot be transpiled: ${why}` });
  }
};
