// Applies the saved theme before the stylesheet paints, so a dark page never flashes light.
// A classic (non-module) script on purpose: it must run synchronously in <head>.
(function () {
  try {
    var theme = localStorage.getItem("llamaserve.theme");
    if (theme === "light" || theme === "dark") document.documentElement.dataset.theme = theme;
  } catch (e) { /* storage disabled: follow the system */ }
})();
