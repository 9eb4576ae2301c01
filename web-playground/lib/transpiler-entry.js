// Bundled by build.sh into transpiler/transpiler.js: jco's component
// transpiler (js-component-bindgen, itself a component jco transpiled) for the
// transpile worker.
export { $init, generate } from '@bytecodealliance/jco-transpile/component';
