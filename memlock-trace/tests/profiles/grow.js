// For tests/profiles.rs: grow allocates an 8 MiB buffer and touchAll touches it every 8 KiB,
// 1,024 page faults in touchAll. With `delete-map`, the script deletes its perf map half a
// second later, before exiting: the tracer must have read it while the process lived (it
// looks at a map every 50 ms, and reads it when it grew). With `linger`, it lives half a
// second longer: V8's code is made executable by mprotect, which sends no notice, so a
// node gone within milliseconds of its faults can leave before a loaded machine's tracer
// reads its maps again and sees that it ran generated code.
const fs = require('fs');
function touchAll(buf) {
  for (let i = 0; i < buf.length; i += 8192) buf[i] = 1;
}
function grow() {
  const buf = Buffer.allocUnsafeSlow(8 << 20);
  touchAll(buf);
  return buf.length;
}
grow();
if (process.argv[2] === 'delete-map') {
  setTimeout(() => fs.unlinkSync(`/tmp/perf-${process.pid}.map`), 500);
}
if (process.argv[2] === 'linger') {
  setTimeout(() => {}, 500);
}
