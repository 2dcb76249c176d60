"""The bilingual lexicon of the built-in corpus.

Every entry pairs one Chinese word (as the grammar emits it: ``李雷``, ``机票``, ``看电视``)
with its English forms. Nothing is inflected at generation time by rule: each entry lists
its forms (plural, 3rd-person singular, past, -ing), so irregular forms are
plain data and tests can compare the generated English against the entry.

Semantic *categories* keep sentences sensible: a verb lists the noun categories it takes
as object (``看 read`` takes ``book``; ``看 watch`` takes ``movie``), the kinds of subject
it takes (``human`` / ``animal`` / a tagged subset such as ``animal:flier``) and the place
tags it can be located at. A noun ``cats`` set may hold several categories and tags
(``food fruit``), so ``animal:pet`` means "a noun whose categories include both".

The tables are kept as text so that adding a word is adding a line.
"""

from __future__ import annotations

from dataclasses import dataclass

# --------------------------------------------------------------------------- entries


@dataclass(frozen=True)
class Pronoun:
    zh: str
    subj: str
    obj: str
    poss: str
    person: int  # 1, 2, 3
    plural: bool


@dataclass(frozen=True)
class Name:
    zh: str
    en: tuple[str, ...]  # ("Li", "Lei")


@dataclass(frozen=True)
class Noun:
    zh: str
    mw: str  # measure word (classifier) used with numerals and demonstratives; "" = none
    en: tuple[str, ...]  # singular ("train", "ticket")
    plural: tuple[str, ...]  # plural ("train", "tickets"); == en for mass nouns
    cats: frozenset[str]
    mass: bool = False  # mass noun: measured by a container ("a cup of tea"), no plural
    container: tuple[str, str] = ("", "")  # mass nouns: ("cup", "cups")
    kin: bool = False  # kinship noun: only used with a possessor (我妈妈 my mother)
    bare_only: bool = False  # school subjects: never counted (英语 English)


@dataclass(frozen=True)
class Place:
    zh: str
    obj: tuple[str, ...]  # as a verb's object: "the park", "Beijing", "home"
    loc_prep: str  # "in" / "at" / "on" / "by"
    loc: tuple[str, ...]  # after the preposition: "the park", "school", "home"
    goal: tuple[str, ...] | None  # after "to": "the park", "school"; None: not a goal
    zh_suffix: str  # 里 in 在公园里, or ""
    tags: frozenset[str]


@dataclass(frozen=True)
class Time:
    zh: str
    en: tuple[str, ...]
    tenses: frozenset[str]  # which clause tenses it goes with


@dataclass(frozen=True)
class Verb:
    """A verb. English forms are word tuples; only the first word inflects."""

    zh: str
    base: tuple[str, ...]  # ("look", "for")
    s3: tuple[str, ...]  # ("looks", "for")
    past: tuple[str, ...]
    ing: tuple[str, ...]
    frame: str  # trans | stative | intrans | ditrans | goal | placeobj | pivot | want | report
    obj: frozenset[str]  # object categories (for ditrans: the direct object)
    subj: frozenset[str]  # subject categories: human, animal, animal:flier ...
    loc: frozenset[str]  # place tags it may be located at ("在公园里"); empty: none
    to: bool = True  # pivot verbs: "ask X to V" (True) vs "let X V" (False)


@dataclass(frozen=True)
class Adjective:
    zh: str
    en: str
    attr: str  # "mono" (黑猫), "de" (可爱的猫) or "" (predicate only)
    pred: bool  # usable as a predicate: 他很高兴 He is very happy
    cats: frozenset[str]  # noun categories (and "human"/"animal" for subjects)


@dataclass(frozen=True)
class Adverb:
    """An adverb of the clause: 也 also, 经常 often. ``post``: after 不 / 会 in Chinese and
    after "not" in English (不经常去 does not often go); otherwise before them (也不去 also
    does not go). ``tenses``: the clause tenses it goes with."""

    zh: str
    en: str
    post: bool
    tenses: frozenset[str]


# --------------------------------------------------------------------------- tables


def _rows(table: str) -> list[list[str]]:
    lines = (line.strip() for line in table.strip().splitlines())
    return [[c.strip() for c in line.split("|")] for line in lines
            if line and not line.startswith("#")]


def _t(s: str) -> tuple[str, ...]:
    return tuple(s.split())


PRONOUNS_TABLE = """
# zh | subject | object | possessive | person | plural
我   | I    | me   | my    | 1 | n
你   | you  | you  | your  | 2 | n
他   | he   | him  | his   | 3 | n
她   | she  | her  | her   | 3 | n
我们 | we   | us   | our   | 1 | y
他们 | they | them | their | 3 | y
"""

NAMES_TABLE = """
李雷 | Li Lei
韩梅梅 | Han Meimei
汤姆 | Tom
玛丽 | Mary
小明 | Xiaoming
小红 | Xiaohong
杰克 | Jack
露西 | Lucy
莉莉 | Lily
安娜 | Anna
大卫 | David
彼得 | Peter
约翰 | John
艾米 | Amy
琳达 | Linda
迈克 | Mike
凯特 | Kate
张伟 | Zhang Wei
王芳 | Wang Fang
刘洋 | Liu Yang
陈静 | Chen Jing
李娜 | Li Na
张明 | Zhang Ming
赵磊 | Zhao Lei
孙丽 | Sun Li
周杰 | Zhou Jie
吴刚 | Wu Gang
马克 | Mark
爱丽丝 | Alice
鲍勃 | Bob
萨拉 | Sarah
艾玛 | Emma
詹姆斯 | James
索菲亚 | Sophia
丹尼尔 | Daniel
汉娜 | Hannah
乔治 | George
"""

# zh | measure word | singular | plural | categories and tags
NOUNS_TABLE = """
猫 | 只 | cat | cats | animal pet small
狗 | 只 | dog | dogs | animal pet
小猫 | 只 | kitten | kittens | animal pet small
小狗 | 只 | puppy | puppies | animal pet small
鸟 | 只 | bird | birds | animal flier small
兔子 | 只 | rabbit | rabbits | animal pet small
老虎 | 只 | tiger | tigers | animal wild
熊猫 | 只 | panda | pandas | animal wild
猴子 | 只 | monkey | monkeys | animal wild
大象 | 头 | elephant | elephants | animal wild
马 | 匹 | horse | horses | animal farm ride
牛 | 头 | cow | cows | animal farm
羊 | 只 | sheep | sheep | animal farm
鸭子 | 只 | duck | ducks | animal farm swimmer
鸡 | 只 | chicken | chickens | animal farm
鱼 | 条 | fish | fish | animal swimmer small pet
老鼠 | 只 | mouse | mice | animal small
蝴蝶 | 只 | butterfly | butterflies | animal flier small
狮子 | 只 | lion | lions | animal wild
熊 | 只 | bear | bears | animal wild swimmer
狼 | 只 | wolf | wolves | animal wild
狐狸 | 只 | fox | foxes | animal wild
蛇 | 条 | snake | snakes | animal wild
青蛙 | 只 | frog | frogs | animal small swimmer
鹅 | 只 | goose | geese | animal farm swimmer
企鹅 | 只 | penguin | penguins | animal wild swimmer
长颈鹿 | 只 | giraffe | giraffes | animal wild
乌龟 | 只 | turtle | turtles | animal pet small swimmer
蜜蜂 | 只 | bee | bees | animal flier small
松鼠 | 只 | squirrel | squirrels | animal small
鹦鹉 | 只 | parrot | parrots | animal pet flier
猫头鹰 | 只 | owl | owls | animal flier
袋鼠 | 只 | kangaroo | kangaroos | animal wild
蚂蚁 | 只 | ant | ants | animal small
蜘蛛 | 只 | spider | spiders | animal small
鸽子 | 只 | pigeon | pigeons | animal flier small
海豚 | 条 | dolphin | dolphins | animal swimmer
男孩 | 个 | boy | boys | person child
女孩 | 个 | girl | girls | person child
孩子 | 个 | child | children | person child
婴儿 | 个 | baby | babies | person child
学生 | 个 | student | students | person
老师 | 位 | teacher | teachers | person social
医生 | 位 | doctor | doctors | person social
护士 | 个 | nurse | nurses | person
司机 | 个 | driver | drivers | person
农民 | 个 | farmer | farmers | person
警察 | 个 | policeman | policemen | person
男人 | 个 | man | men | person
女人 | 个 | woman | women | person
厨师 | 个 | chef | chefs | person
工人 | 个 | worker | workers | person
作家 | 位 | writer | writers | person
记者 | 个 | reporter | reporters | person
经理 | 个 | manager | managers | person social
邻居 | 个 | neighbor | neighbors | person social
同学 | 个 | classmate | classmates | person social
朋友 | 个 | friend | friends | person social
画家 | 位 | painter | painters | person
歌手 | 个 | singer | singers | person
运动员 | 个 | athlete | athletes | person
书 | 本 | book | books | book
杂志 | 本 | magazine | magazines | book
报纸 | 份 | newspaper | newspapers | book
词典 | 本 | dictionary | dictionaries | book
漫画书 | 本 | comic book | comic books | book
小说 | 本 | novel | novels | book writable
日记 | 本 | diary | diaries | book
诗 | 首 | poem | poems | book writable
信 | 封 | letter | letters | letter writable
明信片 | 张 | postcard | postcards | letter writable
包裹 | 个 | package | packages | letter
电子邮件 | 封 | email | emails | letter writable
电影 | 部 | movie | movies | movie
歌 | 首 | song | songs | song writable
故事 | 个 | story | stories | story writable
游戏 | 个 | game | games | game
笔 | 支 | pen | pens | thing
铅笔 | 支 | pencil | pencils | thing
本子 | 个 | notebook | notebooks | thing
电脑 | 台 | computer | computers | thing device switch
手机 | 部 | phone | phones | thing device
相机 | 台 | camera | cameras | thing device
手表 | 块 | watch | watches | thing device
钥匙 | 把 | key | keys | thing
伞 | 把 | umbrella | umbrellas | thing
包 | 个 | bag | bags | thing box
盒子 | 个 | box | boxes | thing box
球 | 个 | ball | balls | thing ball toy
风筝 | 个 | kite | kites | thing toy
杯子 | 个 | cup | cups | thing wash
盘子 | 个 | plate | plates | thing wash
礼物 | 个 | gift | gifts | thing gift
照片 | 张 | photo | photos | thing photo
地图 | 张 | map | maps | thing
画 | 幅 | painting | paintings | thing
玩具 | 个 | toy | toys | thing toy
娃娃 | 个 | doll | dolls | thing toy
灯 | 盏 | lamp | lamps | thing switch
镜子 | 面 | mirror | mirrors | thing
衬衫 | 件 | shirt | shirts | clothes
外套 | 件 | coat | coats | clothes
毛衣 | 件 | sweater | sweaters | clothes
裙子 | 条 | skirt | skirts | clothes
连衣裙 | 条 | dress | dresses | clothes
帽子 | 顶 | hat | hats | clothes
围巾 | 条 | scarf | scarves | clothes
桌子 | 张 | table | tables | furniture
椅子 | 把 | chair | chairs | furniture seat
床 | 张 | bed | beds | furniture seat
沙发 | 个 | sofa | sofas | furniture seat
书架 | 个 | bookshelf | bookshelves | furniture
苹果 | 个 | apple | apples | food fruit
香蕉 | 根 | banana | bananas | food fruit
橘子 | 个 | orange | oranges | food fruit
梨 | 个 | pear | pears | food fruit
桃子 | 个 | peach | peaches | food fruit
西瓜 | 个 | watermelon | watermelons | food fruit
草莓 | 个 | strawberry | strawberries | food fruit
蛋糕 | 个 | cake | cakes | food make
鸡蛋 | 个 | egg | eggs | food
饺子 | 个 | dumpling | dumplings | food make
包子 | 个 | bun | buns | food make
汉堡 | 个 | hamburger | hamburgers | food
三明治 | 个 | sandwich | sandwiches | food make
饼干 | 块 | cookie | cookies | food make
土豆 | 个 | potato | potatoes | food
西红柿 | 个 | tomato | tomatoes | food
汽车 | 辆 | car | cars | vehicle drive
自行车 | 辆 | bike | bikes | vehicle ride
公共汽车 | 辆 | bus | buses | vehicle drive transit goal
出租车 | 辆 | taxi | taxis | vehicle drive transit
火车 | 列 | train | trains | vehicle transit goal
飞机 | 架 | plane | planes | vehicle transit goal
船 | 艘 | boat | boats | vehicle transit goal
卡车 | 辆 | truck | trucks | vehicle drive
机票 | 张 | ticket | tickets | ticket goal
火车票 | 张 | train ticket | train tickets | ticket goal
船票 | 张 | boat ticket | boat tickets | ticket goal
电影票 | 张 | movie ticket | movie tickets | ticket
花 | 朵 | flower | flowers | plant flower
玫瑰 | 朵 | rose | roses | plant flower
树 | 棵 | tree | trees | plant tree
"""

# mass nouns: zh | measure word | English | container singular/plural | categories
MASS_TABLE = """
米饭 | 碗 | rice | bowl bowls | foodm
面条 | 碗 | noodles | bowl bowls | foodm
粥 | 碗 | porridge | bowl bowls | foodm
面包 | 片 | bread | slice slices | foodm
茶 | 杯 | tea | cup cups | drink
咖啡 | 杯 | coffee | cup cups | drink
水 | 杯 | water | glass glasses | drink
牛奶 | 瓶 | milk | bottle bottles | drink
果汁 | 杯 | juice | glass glasses | drink
可乐 | 罐 | cola | can cans | drink
啤酒 | 瓶 | beer | bottle bottles | drink
"""

# school subjects: counted never, used bare (他教我们英语 He teaches us English)
SUBJECTS_TABLE = """
英语 | English
中文 | Chinese
数学 | math
历史 | history
音乐 | music
美术 | art
物理 | physics
化学 | chemistry
地理 | geography
科学 | science
"""

# kinship nouns, only with a possessor: 我妈妈 my mother, 李雷的哥哥 Li Lei's older brother
KIN_TABLE = """
妈妈 | mother
爸爸 | father
哥哥 | older brother
姐姐 | older sister
弟弟 | younger brother
妹妹 | younger sister
爷爷 | grandfather
奶奶 | grandmother
儿子 | son
女儿 | daughter
叔叔 | uncle
阿姨 | aunt
"""

# zh | as object | locative "prep: noun phrase" | goal (after "to"; - = none) | 里? | tags
PLACES_TABLE = """
北京 | Beijing | in: Beijing | Beijing | | city
上海 | Shanghai | in: Shanghai | Shanghai | | city
广州 | Guangzhou | in: Guangzhou | Guangzhou | | city
深圳 | Shenzhen | in: Shenzhen | Shenzhen | | city
南京 | Nanjing | in: Nanjing | Nanjing | | city
杭州 | Hangzhou | in: Hangzhou | Hangzhou | | city
成都 | Chengdu | in: Chengdu | Chengdu | | city
西安 | Xi'an | in: Xi'an | Xi'an | | city
香港 | Hong Kong | in: Hong Kong | Hong Kong | | city
天津 | Tianjin | in: Tianjin | Tianjin | | city
武汉 | Wuhan | in: Wuhan | Wuhan | | city
重庆 | Chongqing | in: Chongqing | Chongqing | | city
伦敦 | London | in: London | London | | city
纽约 | New York | in: New York | New York | | city
巴黎 | Paris | in: Paris | Paris | | city
东京 | Tokyo | in: Tokyo | Tokyo | | city
悉尼 | Sydney | in: Sydney | Sydney | | city
中国 | China | in: China | China | | city country
美国 | America | in: America | America | | city country
英国 | Britain | in: Britain | Britain | | city country
日本 | Japan | in: Japan | Japan | | city country
法国 | France | in: France | France | | city country
德国 | Germany | in: Germany | Germany | | city country
加拿大 | Canada | in: Canada | Canada | | city country
澳大利亚 | Australia | in: Australia | Australia | | city country
公园 | the park | in: the park | the park | 里 | outdoor visit
学校 | the school | at: school | school | | school work study visit
图书馆 | the library | in: the library | the library | 里 | study read work visit
医院 | the hospital | in: the hospital | the hospital | | work
商店 | the shop | in: the shop | the shop | 里 | shop work
超市 | the supermarket | at: the supermarket | the supermarket | | shop work
餐厅 | the restaurant | in: the restaurant | the restaurant | 里 | eat work
家 | home | at: home | - | | home read study
办公室 | the office | in: the office | the office | 里 | work room study
教室 | the classroom | in: the classroom | the classroom | 里 | school study room
动物园 | the zoo | at: the zoo | the zoo | | outdoor visit zoo work
博物馆 | the museum | in: the museum | the museum | | visit work
花园 | the garden | in: the garden | the garden | 里 | outdoor garden read
厨房 | the kitchen | in: the kitchen | the kitchen | 里 | kitchen room
车站 | the station | at: the station | the station | | station
机场 | the airport | at: the airport | the airport | | station work
海边 | the beach | on: the beach | the beach | | outdoor water
河边 | the river | by: the river | the river | | outdoor water
游泳池 | the pool | in: the pool | the pool | 里 | water
银行 | the bank | at: the bank | the bank | | work
电影院 | the cinema | at: the cinema | the cinema | | cinema
咖啡馆 | the cafe | in: the cafe | the cafe | 里 | eat read
书店 | the bookstore | in: the bookstore | the bookstore | 里 | shop read work
酒店 | the hotel | at: the hotel | the hotel | | work
农场 | the farm | on: the farm | the farm | | outdoor farm work visit garden
村子 | the village | in: the village | the village | 里 | outdoor visit
操场 | the playground | on: the playground | the playground | | outdoor school
"""

# zh | English | tenses (present = habitual present, progressive = happening now)
TIMES_TABLE = """
昨天 | yesterday | past
前天 | the day before yesterday | past
昨晚 | last night | past
上周 | last week | past
上周末 | last weekend | past
上个月 | last month | past
去年 | last year | past
明天 | tomorrow | future
后天 | the day after tomorrow | future
明晚 | tomorrow night | future
下周 | next week | future
下周末 | next weekend | future
下个月 | next month | future
明年 | next year | future
每天 | every day | present
每天早上 | every morning | present
每天晚上 | every evening | present
每周 | every week | present
每个周末 | every weekend | present
每年 | every year | present
现在 | now | progressive
今天 | today | past future progressive
星期一 | on Monday | past future present
星期二 | on Tuesday | past future present
星期三 | on Wednesday | past future present
星期四 | on Thursday | past future present
星期五 | on Friday | past future present
星期六 | on Saturday | past future present
星期天 | on Sunday | past future present
"""

# zh | base | 3sg | past | -ing | frame | objects | subjects | places
# Multi-word English verbs inflect their first word only ("look for" -> "looked for").
VERBS_TABLE = """
看 | read | reads | read | reading | trans | book | human | read study home
看 | watch | watches | watched | watching | trans | movie | human | cinema home
看 | visit | visits | visited | visiting | trans | person | human | city home
看见 | see | sees | saw | seeing | trans | animal person thing vehicle plant furniture | human animal | outdoor city zoo farm
买 | buy | buys | bought | buying | trans | thing food book clothes ticket plant furniture animal:pet drink foodm vehicle | human | shop city
卖 | sell | sells | sold | selling | trans | thing food book clothes vehicle plant furniture | human | shop city
订 | book | books | booked | booking | trans | ticket | human | home room
吃 | eat | eats | ate | eating | trans | food foodm | human animal | eat home kitchen
喝 | drink | drinks | drank | drinking | trans | drink | human | eat home kitchen
喜欢 | like | likes | liked | liking | stative | animal person food foodm drink book movie song story game thing clothes plant city subject | human |
爱 | love | loves | loved | loving | stative | person animal:pet city | human |
想念 | miss | misses | missed | missing | stative | person city | human |
认识 | know | knows | knew | knowing | stative | person | human |
需要 | need | needs | needed | needing | stative | thing ticket clothes | human |
追 | chase | chases | chased | chasing | trans | animal person vehicle | human animal | outdoor
写 | write | writes | wrote | writing | trans | writable | human | home study room
画 | draw | draws | drew | drawing | trans | animal plant vehicle toy | human | home school garden
带 | bring | brings | brought | bringing | trans | thing food book | human |
找 | look for | looks for | looked for | looking for | trans | thing animal:pet person | human | outdoor city home shop
找到 | find | finds | found | finding | trans | thing animal:pet | human | outdoor city home
丢 | lose | loses | lost | losing | trans | thing ticket | human | city outdoor station
借 | borrow | borrows | borrowed | borrowing | trans | thing book | human | study school
洗 | wash | washes | washed | washing | trans | clothes vehicle:drive thing:wash | human | home kitchen
修 | fix | fixes | fixed | fixing | trans | vehicle thing:device | human | home work
打扫 | clean | cleans | cleaned | cleaning | placeobj | room | human |
参观 | visit | visits | visited | visiting | placeobj | visit | human |
离开 | leave | leaves | left | leaving | placeobj | city school home work | human |
去 | go | goes | went | going | goal | any | human |
帮 | help | helps | helped | helping | trans | person | human | home school work
等 | wait for | waits for | waited for | waiting for | trans | person vehicle:transit | human | station outdoor
见 | meet | meets | met | meeting | trans | person | human | city eat outdoor
照顾 | take care of | takes care of | took care of | taking care of | trans | animal person plant | human | home farm zoo
喂 | feed | feeds | fed | feeding | trans | animal | human | farm zoo home outdoor
骑 | ride | rides | rode | riding | trans | vehicle:ride animal:ride | human | outdoor city
开 | drive | drives | drove | driving | trans | vehicle:drive | human | city
开 | turn on | turns on | turned on | turning on | trans | thing:switch | human | home room
坐 | take | takes | took | taking | trans | vehicle:transit | human |
坐 | sit on | sits on | sat on | sitting on | trans | furniture:seat | human animal | home
打开 | open | opens | opened | opening | trans | thing:box letter | human | home room
做 | make | makes | made | making | trans | food:make toy | human | kitchen home
种 | plant | plants | planted | planting | trans | plant | human | garden
摘 | pick | picks | picked | picking | trans | flower fruit | human | garden
抓 | catch | catches | caught | catching | trans | animal:small | human animal | outdoor
听 | listen to | listens to | listened to | listening to | trans | song story | human | home
唱 | sing | sings | sang | singing | trans | song | human | school home
讲 | tell | tells | told | telling | trans | story | human | school home
玩 | play | plays | played | playing | trans | game | human | home
寄 | send | sends | sent | sending | trans | letter gift photo | human |
收到 | receive | receives | received | receiving | trans | letter gift | human |
扔 | throw | throws | threw | throwing | trans | ball | human | outdoor
踢 | kick | kicks | kicked | kicking | trans | ball | human | outdoor
穿 | wear | wears | wore | wearing | trans | clothes | human |
学 | learn | learns | learned | learning | trans | subject | human | school study
教 | teach | teaches | taught | teaching | ditrans | subject | human | school
给 | give | gives | gave | giving | ditrans | thing food book gift ticket flower clothes | human |
跑步 | run | runs | ran | running | intrans | | human animal | outdoor
游泳 | swim | swims | swam | swimming | intrans | | human animal:swimmer | water
睡觉 | sleep | sleeps | slept | sleeping | intrans | | human animal | home
跳舞 | dance | dances | danced | dancing | intrans | | human | school home
工作 | work | works | worked | working | intrans | | human | work city
学习 | study | studies | studied | studying | intrans | | human | study school
休息 | rest | rests | rested | resting | intrans | | human animal | home outdoor
哭 | cry | cries | cried | crying | intrans | | human | home school
笑 | laugh | laughs | laughed | laughing | intrans | | human | home school
散步 | take a walk | takes a walk | took a walk | taking a walk | intrans | | human | outdoor
做饭 | cook | cooks | cooked | cooking | intrans | | human | kitchen
做作业 | do homework | does homework | did homework | doing homework | intrans | | human | home study
回家 | go home | goes home | went home | going home | intrans | | human |
看电视 | watch TV | watches TV | watched TV | watching TV | intrans | | human | home
打篮球 | play basketball | plays basketball | played basketball | playing basketball | intrans | | human | outdoor school
踢足球 | play football | plays football | played football | playing football | intrans | | human | outdoor school
弹钢琴 | play the piano | plays the piano | played the piano | playing the piano | intrans | | human | home school
起床 | get up | gets up | got up | getting up | intrans | | human |
洗澡 | take a bath | takes a bath | took a bath | taking a bath | intrans | | human |
钓鱼 | go fishing | goes fishing | went fishing | going fishing | intrans | | human | water
购物 | go shopping | goes shopping | went shopping | going shopping | intrans | | human | city
爬山 | go hiking | goes hiking | went hiking | going hiking | intrans | | human |
画画 | paint | paints | painted | painting | intrans | | human | home school garden
飞 | fly | flies | flew | flying | intrans | | animal:flier | outdoor
上班 | go to work | goes to work | went to work | going to work | intrans | | human |
请 | ask | asks | asked | asking | pivot | | human |
叫 | tell | tells | told | telling | pivot | | human |
教 | teach | teaches | taught | teaching | pivot | | human |
让 | let | lets | let | letting | pivot | | human |
想 | want | wants | wanted | wanting | want | | human |
觉得 | think | thinks | thought | thinking | report | | human |
知道 | know | knows | knew | knowing | report | | human |
"""

# zh | English | attributive (mono: 黑猫, de: 可爱的猫, -: none) | predicate? | categories
ADJECTIVES_TABLE = """
黑 | black | mono | n | animal clothes thing vehicle furniture
白 | white | mono | n | animal clothes thing vehicle furniture flower
红 | red | mono | n | clothes thing vehicle flower
黄 | yellow | mono | n | clothes thing vehicle flower
蓝 | blue | mono | n | clothes thing vehicle
绿 | green | mono | n | clothes thing vehicle
大 | big | mono | y | animal thing vehicle furniture fruit tree city
新 | new | mono | n | thing clothes vehicle book furniture
旧 | old | mono | y | thing clothes vehicle book furniture
胖 | fat | mono | y | person animal
瘦 | thin | mono | y | person animal
可爱 | cute | de | y | animal child
漂亮 | beautiful | de | y | person clothes flower thing city
有趣 | interesting | de | y | book movie story game person
聪明 | clever | de | y | person animal
便宜 | cheap | de | y | thing clothes ticket book
贵 | expensive | de | y | thing clothes ticket vehicle
干净 | clean | de | y | clothes thing
安静 | quiet | de | y | person
奇怪 | strange | de | y | animal person thing
危险 | dangerous | de | y | wild
友好 | friendly | de | y | person animal
年轻 | young | de | y | person
著名 | famous | de | y | person
重要 | important | de | y | letter book
可怕 | scary | de | y | wild movie story
新鲜 | fresh | de | y | food
舒服 | comfortable | de | y | furniture clothes
勇敢 | brave | de | y | person
善良 | kind | de | y | person
懒惰 | lazy | de | y | person animal
好吃 | delicious | de | y | food foodm
高兴 | happy | - | y | human animal
累 | tired | - | y | human animal
饿 | hungry | - | y | human animal
渴 | thirsty | - | y | human animal
忙 | busy | - | y | human
生气 | angry | - | y | human
紧张 | nervous | - | y | human
无聊 | bored | - | y | human
困 | sleepy | - | y | human animal
冷 | cold | - | y | human animal
"""

# Adjective + noun combinations that are words of their own in Chinese (大熊猫 = giant
# panda), so the grammar never builds them.
BLOCKED_ADJ_NOUN = frozenset({("大", "熊猫")})

# zh | en | post (after 不/会, "not") | tenses
_ALL = "present past progressive future"
ADVERBS = tuple(Adverb(zh, en, post == "y", frozenset(t.split())) for zh, en, post, t in (
    ("也", "also", "n", _ALL), ("真的", "really", "n", _ALL),
    ("有时候", "sometimes", "n", "present"), ("经常", "often", "y", "present future"),
    ("总是", "always", "y", "present")))

# numerals before a measure word: 一 (a/an), 两 (two) ... 十 (ten)
NUMERALS = (
    ("一", "a"),
    ("两", "two"),
    ("三", "three"),
    ("四", "four"),
    ("五", "five"),
    ("六", "six"),
    ("七", "seven"),
    ("八", "eight"),
    ("九", "nine"),
    ("十", "ten"),
)

# --------------------------------------------------------------------------- loading


def _load():
    pronouns = tuple(
        Pronoun(zh, s, o, p, int(person), pl == "y")
        for zh, s, o, p, person, pl in _rows(PRONOUNS_TABLE)
    )
    names = tuple(Name(zh, _t(en)) for zh, en in _rows(NAMES_TABLE))
    nouns = []
    for zh, mw, sg, pl, cats in _rows(NOUNS_TABLE):
        nouns.append(Noun(zh, mw, _t(sg), _t(pl), frozenset(cats.split())))
    for zh, mw, en, cont, cats in _rows(MASS_TABLE):
        c_sg, c_pl = cont.split()
        nouns.append(
            Noun(zh, mw, _t(en), _t(en), frozenset(cats.split()), mass=True, container=(c_sg, c_pl))
        )
    for zh, en in _rows(SUBJECTS_TABLE):
        nouns.append(Noun(zh, "", _t(en), _t(en), frozenset({"subject"}), bare_only=True))
    for zh, en in _rows(KIN_TABLE):
        nouns.append(Noun(zh, "", _t(en), _t(en), frozenset({"person", "kin"}), kin=True))
    places = []
    for zh, obj, loc, goal, suffix, tags in _rows(PLACES_TABLE):
        prep, _, loc_np = loc.partition(":")
        places.append(
            Place(
                zh,
                _t(obj),
                prep.strip(),
                _t(loc_np),
                None if goal == "-" else _t(goal),
                suffix,
                frozenset(tags.split()),
            )
        )
    times = tuple(Time(zh, _t(en), frozenset(t.split())) for zh, en, t in _rows(TIMES_TABLE))
    verbs = tuple(
        Verb(zh, _t(base), _t(s3), _t(past), _t(ing), frame, frozenset(obj.split()),
             frozenset(subj.split()), frozenset(loc.split()), to=(zh != "让"))
        for zh, base, s3, past, ing, frame, obj, subj, loc in _rows(VERBS_TABLE)
    )
    adjectives = tuple(
        Adjective(zh, en, "" if attr == "-" else attr, pred == "y", frozenset(cats.split()))
        for zh, en, attr, pred, cats in _rows(ADJECTIVES_TABLE)
    )
    return pronouns, names, tuple(nouns), tuple(places), times, verbs, adjectives


PRONOUNS, NAMES, NOUNS, PLACES, TIMES, VERBS, ADJECTIVES = _load()

# Chinese verbs of several entries, told apart by the object: 看 is read, watch or visit
# (so 你看了什么？ would be ambiguous)
AMBIGUOUS_VERBS = frozenset(v.zh for v in VERBS if [u.zh for u in VERBS].count(v.zh) > 1)

# a word of each kind by its Chinese: pronoun("我"), name("李雷"), noun("机票"), ...
# (verb: not the ambiguous ones)
pronoun, name, noun, place, time, adjective, verb = (
    {w.zh: w for w in words}.__getitem__
    for words in (PRONOUNS, NAMES, NOUNS, PLACES, TIMES, ADJECTIVES,
                  [v for v in VERBS if v.zh not in AMBIGUOUS_VERBS]))

