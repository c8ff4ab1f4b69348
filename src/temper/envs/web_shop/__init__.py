"""The web_shop environment (issue 31 items 4-5): a browser agent on a local shop, one concept per module.

site.py     the seeded catalogue (products: name, category, colour, price)
server.py   the shop as a local HTTP application (ThreadingHTTPServer), one state per episode
page.py     HTML -> numbered elements and text (html.parser), rendered compactly, truncated
goals.py    templates -> goals, grading from the server's state, the scripted expert
env.py      one episode: click / type / goto / back / answer over real HTTP requests
pool.py     goals on generated sites per split, admitted when the scripted expert solves them
curriculum.py  variants of the goals RL fails (WebRL's self-evolving curriculum)
task.py     the task: splits, keys, demonstrations
"""
