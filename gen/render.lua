-- klgen's template engine (embedded in the binaries; runs in the sandbox).
--
-- A template is text, line by line:
--   % <lua>          a line whose first non-blank character is '%' is Lua code
--   text <%= e %>    any other line is output, with each <%= e %> replaced by e
-- Each template line becomes exactly one line of the compiled chunk, so a Lua
-- error names the template line; and each output line is traced back to its
-- template line with #line directives, so NVRTC's errors point there too.

local load = ...  -- handed in by render.c: the sandbox has no global `load`
local M = {}

local function value(v, line, expr, tname)
  local ty = type(v)
  if ty == "number" then
    local i = math.tointeger(v)
    if i then return tostring(i) end
    return string.format("%.17g", v)
  elseif ty == "string" then
    return v
  end
  error(string.format("%s:%d: <%%= %s %%> is %s, not a number or string",
                      tname, line, expr, ty), 0)
end

-- Template text -> Lua source whose line k is template line k.
local function compile(text, tname)
  local out, n = {}, 0
  if text:sub(-1) ~= "\n" then text = text .. "\n" end
  for line in text:gmatch("(.-)\n") do
    n = n + 1
    local code = line:match("^%s*%%(.*)$")
    if code then
      out[n] = code
    else
      local parts, pos = {}, 1
      while true do
        local s, e = line:find("<%=", pos, true)
        if not s then
          parts[#parts + 1] = string.format("%q", line:sub(pos))
          break
        end
        parts[#parts + 1] = string.format("%q", line:sub(pos, s - 1))
        local cs, ce = line:find("%>", e + 1, true)
        if not cs then
          error(string.format("%s:%d: '<%%=' without '%%>'", tname, n), 0)
        end
        local expr = line:sub(e + 1, cs - 1)
        parts[#parts + 1] = string.format("_v((%s), %d, %q)", expr, n, expr)
        pos = ce + 1
      end
      out[n] = string.format("_emit(%d, %s)", n, table.concat(parts, ", "))
    end
  end
  out[1] = "local _emit, _v = ...; " .. (out[1] or "")
  return table.concat(out, "\n")
end

-- Renders `text` with the constants in `env` visible as globals.
-- lines: emit #line directives (CUDA sources) or not (the C header).
function M.render(text, tname, env, lines)
  local src = compile(text, tname)
  local scope = setmetatable({}, { __index = function(_, k)
    local v = env[k]
    if v == nil then v = _G[k] end
    if v == nil then error("unknown name '" .. tostring(k) .. "'", 2) end
    return v
  end })
  local fn, err = load(src, "=" .. tname, "t", scope)
  if not fn then error(err, 0) end
  local buf, last = {}, nil
  local function emit(n, ...)
    if lines and last ~= n - 1 then
      buf[#buf + 1] = string.format('#line %d "%s"', n, tname)
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
  for line in s:gmatch("([^\n]*)\n") do
    local q = line:gsub('[\\"]', "\\%0"):gsub("%c", function(c)
      return string.format("\\%03o", c:byte())
    end)
    t[#t + 1] = '"' .. q .. '\\n"'
  end
  return t
end

return M
