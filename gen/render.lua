-- klgen's template engine (embedded in the binaries; runs in the sandbox).
--
-- A template is text, line by line:
--   % <lua>          a line whose first non-blank character is '%' is Lua code
--   text <%= e %>    any other line is output, with each <%= e %> replaced by e
-- Each template line becomes exactly one line of the compiled chunk, so a Lua
-- error names the template line; and each output line is traced back to its
-- template line with #line directives, so NVRTC's errors point there too.
--
-- Template code runs with the constants, then the sandbox's restricted
-- environment (what a spec may use: no pattern functions, no `load`), under
-- its limits. String methods are the restricted ones for this file too: it
-- calls the pattern functions through `string`.

-- handed in by render.c: the sandbox's load(text, chunkname, env) (there is no
-- global one) and the restricted environment
local load, restricted = ...
local find, format, gmatch, gsub, match, sub = string.find, string.format, string.gmatch,
  string.gsub, string.match, string.sub
local M = {}

local function value(v, line, expr, tname)
  local ty = type(v)
  if ty == "number" then
    local i = math.tointeger(v)
    if i then return tostring(i) end
    return format("%.17g", v)
  elseif ty == "string" then
    return v
  end
  error(format("%s:%d: <%%= %s %%> is %s, not a number or string",
                      tname, line, expr, ty), 0)
end

-- Template text -> Lua source whose line k is template line k.
local function compile(text, tname)
  local out, n = {}, 0
  if sub(text, -1) ~= "\n" then text = text .. "\n" end
  for line in gmatch(text, "(.-)\n") do
    n = n + 1
    local code = match(line, "^%s*%%(.*)$")
    if code then
      out[n] = code
    else
      local parts, pos = {}, 1
      while true do
        local s, e = find(line, "<%=", pos, true)
        if not s then
          parts[#parts + 1] = format("%q", sub(line, pos))
          break
        end
        parts[#parts + 1] = format("%q", sub(line, pos, s - 1))
        local cs, ce = find(line, "%>", e + 1, true)
        if not cs then
          error(format("%s:%d: '<%%=' without '%%>'", tname, n), 0)
        end
        local expr = sub(line, e + 1, cs - 1)
        parts[#parts + 1] = format("_v((%s), %d, %q)", expr, n, expr)
        pos = ce + 1
      end
      out[n] = format("_emit(%d, %s)", n, table.concat(parts, ", "))
    end
  end
  out[1] = "local _emit, _v = ...; " .. (out[1] or "")
  return table.concat(out, "\n")
end

-- Renders `text` with the constants in `env` visible as globals.
-- lines: emit #line directives (CUDA sources) or not (the C header).
function M.render(text, tname, env, lines)
  local src = compile(text, tname)
  local scope = setmetatable({}, { __metatable = false, __index = function(_, k)
    local v = env[k]
    if v == nil then v = rawget(restricted, k) end
    if v == nil then error("unknown name '" .. tostring(k) .. "'", 2) end
    return v
  end })
  local fn = load(src, "=" .. tname, scope)
  local buf, last = {}, nil
  local function emit(n, ...)
    if lines and last ~= n - 1 then
      buf[#buf + 1] = format('#line %d "%s"', n, tname)
    end
    buf[#buf + 1] = table.concat({ ... })
    last = n
  end
  local function v(x, n, expr) return value(x, n, expr, tname) end
  fn(emit, v)
  return table.concat(buf, "\n") .. "\n"
end

-- Source text -> C string literal lines, one per source line.
function M.c_lines(s)
  local t = {}
  for line in gmatch(s, "([^\n]*)\n") do
    local q = gsub(gsub(line, '[\\"]', "\\%0"), "%c", function(c)
      return format("\\%03o", c:byte())
    end)
    t[#t + 1] = '"' .. q .. '\\n"'
  end
  return t
end

return M
